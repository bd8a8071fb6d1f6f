"""Where the driver's small helper actors run (the id pass's facts collector, the main stream's rejects collector):
on the driver's own node, pinned.

Ray places an actor that asks for no CPU on any node, a worker's included; a worker lost to Spot would then take
the actor, and what it holds, with it, and end the run with ActorUnavailableError where Ray Data retries the lost
worker's tasks and the run goes on (stop 74's multinode CI run failed so). The driver's node going ends the run
anyway, so pinning there adds no way to fail.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def on_driver_node() -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
