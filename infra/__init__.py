"""Deploy-time and operator code, in layers a reader can see from the folders.

- ``__main__.py`` and ``components/``, ``k8s/``, ``functions/``, ``statemachines/``: the Pulumi program that
  ``pulumi up`` runs, with ``config.py`` (the stack's typed config), ``naming.py`` and ``versions.py``.
- ``pricing/``: the price table and the cost arithmetic; the program prices the job's tokens from it.
- ``ops/``: the operator tools (plan, policy, preflight, run, status, price refresh), never run by ``pulumi up``.
  Their commands keep the short names ``python -m infra.plan`` etc. through one-line launchers beside this file.

Imports go downwards only (``tests/test_layers.py``): the program never imports ``ops``, and nothing here
imports the job beyond ``workload.contract.config``.
"""
