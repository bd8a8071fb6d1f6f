"""Every version the infrastructure pins, in one place.

Bump here and nowhere else; tests read these constants instead of repeating literals.
"""

from __future__ import annotations

# Kubernetes control plane (EKS tiers): in EKS standard support until 2027-08-02 (infra/facts/eks_versions.json,
# which the plan and preflight warn from 60 days before). EKS upgrades one minor version at a time, so a stack on
# 1.35 (the pin until 2026-12-06, standard support to 2027-03-27) takes one `up` to come here; preflight compares
# the cluster's own version with this (docs/deploy-eks.md).
KUBERNETES_VERSION = "1.36"

# Helm charts (EKS tiers): name -> (repository, version).
# KubeRay 1.7.0: the first to read `authOptions` was 1.5.1 (Ray's token authentication, infra/k8s/ray_auth.py);
# the manifest tests validate against the CRDs of the pinned Karpenter and KubeRay tags (tests/infra/data/crds,
# copied by `python -m tools.crd_sources`; a bump here fails tests/infra/test_crd_sources.py until they are recopied).
HELM_CHARTS: dict[str, tuple[str, str]] = {
    "kuberay-operator": ("https://ray-project.github.io/kuberay-helm/", "1.7.0"),
    "karpenter": ("oci://public.ecr.aws/karpenter/karpenter", "1.14.1"),
    "nvidia-device-plugin": ("https://nvidia.github.io/k8s-device-plugin", "0.18.0"),
    # 9.59.0 ships cluster autoscaler 1.35 with the RBAC it needs (DRA objects, volumeattachments); its ClusterRole
    # also holds every rule of the chart on the cluster-autoscaler-1.36.1 tag (kubernetes/autoscaler, read
    # 2026-12-06), so the 1.36 image runs under it.
    "cluster-autoscaler": ("https://kubernetes.github.io/autoscaler", "9.59.0"),
}
# The cluster autoscaler's minor version must match the control plane's: one image per Kubernetes minor the
# stacks may run, so an upgrade one minor at a time (1.34 -> 1.35 -> 1.36) brings its autoscaler with it.
# Newest patch tag of each minor in kubernetes/autoscaler (cluster-autoscaler-1.x.y), seen 2026-12-01; 1.36.1
# (2026-07-22) the newest 1.36 tag in a snapshot of the repository as of 2026-08-22, read 2026-12-06.
CLUSTER_AUTOSCALER_IMAGE_TAGS: dict[str, str] = {
    "1.33": "v1.33.6",
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}
CLUSTER_AUTOSCALER_IMAGE_TAG = CLUSTER_AUTOSCALER_IMAGE_TAGS[KUBERNETES_VERSION]
# The Kubernetes minors the pinned Karpenter runs on, (oldest, newest): its controller reports "karpenter is not
# compatible with kubernetes version" outside them. MinK8sVersion/MaxK8sVersion of pkg/providers/version/version.go
# at aws/karpenter-provider-aws v1.14.1 (commit bde00654), read 2026-12-06 (the release's compatibility matrix,
# website/content/en/docs/upgrading/compatibility.md, gives "1.13.x" for Kubernetes 1.36). Move with the chart.
KARPENTER_KUBERNETES_RANGE = ("1.26", "1.36")
# Ray inside the job image (pyproject's ray pin); KubeRay configures the cluster for it.
RAY_VERSION = "2.60.0"

# GPU AMIs are looked up at deploy time through AWS's public SSM parameters, never pinned by id.
# The Deep Learning Base OSS Nvidia Driver AMI (Amazon Linux 2023) ships the NVIDIA driver, Docker and the
# NVIDIA container toolkit, which is all the small tier's node needs to run the job image.
GPU_AMI_SSM_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
)
# EKS-optimised accelerated AMI family (managed node groups / Karpenter EC2NodeClass alias).
EKS_GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
# Pinned, so a new AMI release never replaces nodes mid-run (drift); bump it deliberately. It must be an
# amazon-eks-ami release with an AL2023 NVIDIA AMI for the cluster's version: the config checks it against
# infra/facts/eks_ami_releases.json, and `python -m infra.preflight large` resolves its SSM parameter.
EKS_AMI_ALIAS = "al2023@v20260714"
EKS_HEAD_AMI_TYPE = "AL2023_x86_64_STANDARD"
# The NAT instances' image: Amazon Linux 2023 through AWS's public SSM parameter, per architecture.
NAT_AMI_SSM_PARAMETERS = {
    "arm64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    "x86_64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
}

# The job image's base (workload/Dockerfile's BASE_IMAGE default must equal it; a test checks). An exact
# Python patch and Debian release: the GPU libraries come as pip wheels with torch (see the Dockerfile).
# The image's own tag is not a version written here: it is the content hash of its build context
# (infra/build_context.py), so it changes exactly when what the image copies changes.
# Pinned by digest beside the tag: the manifest list (index) digest of python:3.11.14-slim-bookworm, as Docker Hub
# served it once 3.11.15 superseded the tag (which docker-library then stopped rebuilding); read 2026-12-05 from
# public Dockerfiles that pin the same reference (no registry is reachable from the build machine to ask it), index
# 65a93d69fa75..., linux/amd64 manifest 83f339c1be63... To move it: `docker buildx imagetools inspect <tag>`.
WORKLOAD_BASE_IMAGE = (
    "python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d"
)
# g5 and p4d are x86_64.
WORKLOAD_IMAGE_PLATFORM = "linux/amd64"

# Lambda runtimes (cost report and any other function).
LAMBDA_PYTHON_RUNTIME = "python3.12"
