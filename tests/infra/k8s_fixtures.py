"""Renderer inputs shaped like the medium and large tiers, shared by the manifest tests."""

from __future__ import annotations

from infra import versions
from infra.k8s.karpenter import NodeClassArgs
from infra.k8s.rayjob import RayJobArgs, WorkerSpec, fit_job_to_workers
from workload.contract.config import JobConfig

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-batch:0.1.0"


def job_config() -> JobConfig:
    return JobConfig.model_validate(
        {"input": {"uri": "s3://bucket/input/"}, "output": {"uri": "s3://bucket/output/"}, "resume": {}}
    )


def medium_args() -> RayJobArgs:
    """Fixed cluster: two Spot g5.2xlarge workers, no autoscaler."""
    workers = WorkerSpec(min_replicas=2, max_replicas=2)
    return RayJobArgs(
        name="llm-batch",
        namespace="llm-batch",
        image=IMAGE,
        service_account="llm-batch-job",
        worker_service_account="llm-batch-worker",
        ray_version="2.60.0",
        job=fit_job_to_workers(job_config(), workers),
        workers=workers,
    )


def large_args() -> RayJobArgs:
    """Autoscaling 1 to 8 workers on Karpenter nodes, protected from consolidation."""
    workers = WorkerSpec(min_replicas=1, max_replicas=8)
    return RayJobArgs(
        name="llm-batch",
        namespace="llm-batch",
        image=IMAGE,
        service_account="llm-batch-job",
        worker_service_account="llm-batch-worker",
        ray_version="2.60.0",
        job=fit_job_to_workers(job_config(), workers),
        workers=workers,
        autoscaling=True,
        protect_from_consolidation=True,
        labels={"llm-batch.io/stack": "large"},
    )


def node_class_args() -> NodeClassArgs:
    return NodeClassArgs(
        cluster_name="llm-batch-large",
        node_role="llm-batch-large-karpenter-node",
        ami_alias=versions.EKS_AMI_ALIAS,  # a real release (infra/facts/eks_ami_releases.json)
        tags={"llm-batch:project": "llm-batch", "llm-batch:stack": "large", "llm-batch:cost-center": "ml"},
    )
