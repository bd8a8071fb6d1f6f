"""One ComponentResource per concern; each module's type token is ``llmbatch:<module>:<Name>``.

Adding a concern: a module here with a frozen ``<Name>Args`` dataclass and a ``<Name>(name, args, opts)``
component that parents its children (``ResourceOptions(parent=self)``), exposes what others need as
attributes and ends with ``register_outputs``; its args built from the stack config by ``<Name>Args.from_config``.
Then one call where it belongs: ``foundation.py`` (what every tier has), ``eks_tier.py`` (the EKS tiers) or
``infra/__main__.py``, with the tagged provider; where a resource type is new to the mocks, its outputs in
``infra/ops/plan_mocks.py``. Its resources then show in ``python -m infra.plan`` and must pass ``infra.policy``.
A component moved under another keeps its resources' URNs with an alias (tests/infra/test_plan_urns.py).
"""
