"""The Pulumi program (``__main__``) and the operator tools run as modules (``python -m infra.plan``)."""
