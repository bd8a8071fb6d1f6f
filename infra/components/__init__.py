"""One ComponentResource per concern; each module's type token is ``llmbatch:<module>:<Name>``.

Adding a concern: a module here with a frozen ``<Name>Args`` dataclass and a ``<Name>(name, args, opts)``
component that parents its children (``ResourceOptions(parent=self)``), exposes what others need as
attributes and ends with ``register_outputs``; then one call in ``infra/__main__.py`` with ``aws_opts`` (the
tagged provider) and, where a resource type is new to the mocks, its outputs in ``infra/ops/plan_mocks.py``.
Its resources then show in ``python -m infra.plan`` and must pass ``infra.policy``.
"""
