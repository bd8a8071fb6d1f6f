"""One ComponentResource per concern; each module's type token is ``llmbatch:<module>:<Name>``."""
