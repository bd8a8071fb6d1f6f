"""One copy of the model per GPU node, on a disk that holds it: the stack config's checks and the volume's size."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfigError
from infra.eks_job import base_rayjob_args
from infra.k8s.model_disk import disk_problem, models_volume, models_volume_gib
from infra.ops.stacks import offline_config
from tests.infra.k8s_fixtures import IMAGE


def test_the_volume_holds_the_weights_and_the_compile_caches() -> None:
    assert models_volume_gib(131.4) == 148  # 131.4 x 1.05 + 10, rounded up
    assert models_volume(15.0) == "26Gi"
    assert models_volume(None) == "11Gi"  # the embedded tiny model: its caches only


@pytest.mark.parametrize(
    ("stack", "overrides", "message"),
    [
        (
            "large",
            {"eks.node_pool.instance_types": ["g5.xlarge", "p4d.24xlarge"]},
            r"worker_size.gpus \(1\) is not the 8 GPUs of p4d.24xlarge in node_pool.instance_types: a worker pod "
            "takes all of its node's GPUs",
        ),
        (
            "medium",
            {"eks.gpu_instance_type": "g5.12xlarge", "eks.worker_size": {"cpu": "6", "memory": "24Gi", "gpus": 1}},
            r"worker_size.gpus \(1\) is not the 4 GPUs of g5.12xlarge in gpu_instance_type",
        ),
        (
            "medium",
            {"serve.enabled": True, "serve.instance_type": "g5.12xlarge"},
            r"worker_size.gpus \(1\) is not the 4 GPUs of g5.12xlarge in instance_type",
        ),
        (
            "medium",
            {"job.model_source": "s3://bucket/models/llama"},
            r"job.model_weights_gib is required with job.model_source on the EKS tiers",
        ),
        (
            "small",
            {"job.model_source": "s3://bucket/models/llama", "job.model_weights_gib": 200},
            r"200 GiB of weights need a 220 GiB models volume .* g5.xlarge has 193 GiB for it on its 250 GB of "
            r"instance-store NVMe .*\(small.instance_type\)",
        ),
        (
            "large",
            # Refused before its disk is weighed: no worker group's GPUs hold 756 GiB (infra/config/worker_groups.py);
            # every type of both large pools has the instance store for any model that fits their GPUs.
            {"job.model_source": "s3://bucket/models/llama-405b", "job.model_weights_gib": 756},
            r"756.0 GiB a GPU, more than the 19.8 GiB .* does not fit even 8 of these GPUs",
        ),
    ],
    ids=["pool-mixes-gpu-counts", "managed-type-has-more-gpus", "serve-type-has-more-gpus", "no-weights", "small-disk",
         "pool-disk"],
)  # fmt: skip
def test_a_worker_smaller_than_its_node_or_a_model_bigger_than_its_disk_is_refused(
    stack: str, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(StackConfigError, match=message):
        offline_config(stack, overrides)


def test_a_node_without_instance_store_offers_its_root_volume_beside_the_image() -> None:
    problem = disk_problem(180, "g6e.xlarge", 200)
    assert problem is not None and "g6e.xlarge has 160 GiB for it on its 200 GiB gp3 root volume" in problem
    assert disk_problem(100, "g6e.xlarge", 200) is None


def test_the_workers_volume_comes_from_the_stacks_model_size() -> None:
    config = offline_config("large", {"job.model_source": "s3://bucket/models/llama", "job.model_weights_gib": 15.0})
    assert base_rayjob_args(config, "large", IMAGE, "bucket").workers.models_volume == "26Gi"
    assert base_rayjob_args(offline_config("large"), "large", IMAGE, "bucket").workers.models_volume == "11Gi"
