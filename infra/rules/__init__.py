"""The policy rules, in the one package both places that run them import: the offline gate (`python -m
infra.plan`, `python -m infra.policy`, over the program's plan under mocks) and the policy pack
(infra/policy_pack/, on every real `pulumi preview/up --policy-pack`).

`registry.RULES` names every rule (its check, fix, tiers and enforcement); the `checks_*` modules hold the
checks by concern over a plan (`plan_view`); `policy_stack` reads the engine's resources as that plan for the
pack and tells which rules a first preview cannot judge. Nothing here imports pulumi_policy (the pack's own
virtualenv has it, the project's has not) or infra.ops (tests/test_layers.py): plain functions over data.
"""
