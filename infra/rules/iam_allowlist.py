"""The only exceptions to the IAM rules, each with its reason; `infra.policy` checks every document with it.

The rules (for Allow statements; Deny statements only take permissions away):
- never the action `*` or `service:*`, and never `NotAction`;
- a wildcard inside an action name only when listed in `ACTION_WILDCARDS`;
- `Resource: "*"` only for actions listed in `RESOURCE_STAR_ACTIONS` (AWS has no resource-level permission
  for them) or in a document kind listed in `RESOURCE_STAR_DOCUMENTS`;
- the action `*` only in a document kind listed in `WHOLE_SERVICE_DOCUMENTS` (a perimeter that grants nothing);
- AWS-managed policies only when listed in `MANAGED_POLICIES`.

Add an entry here, with its reason, rather than weakening a check.
"""

from __future__ import annotations

ACTION_WILDCARDS: dict[str, str] = {
    # The key policy's administrator statement, as AWS documents it: without it the key can never be managed.
    "kms:Create*": "key policy: key administration (aliases, grants)",
    "kms:Describe*": "key policy: key administration and CloudWatch Logs describing the key",
    "kms:Enable*": "key policy: key administration (enable key, rotation)",
    "kms:List*": "key policy: key administration (read-only listing)",
    "kms:Put*": "key policy: key administration (key policy updates)",
    "kms:Update*": "key policy: key administration (alias, description)",
    "kms:Revoke*": "key policy: key administration (grants)",
    "kms:Disable*": "key policy: key administration (disable key, rotation)",
    "kms:Get*": "key policy: key administration (read policy, rotation status)",
    "kms:Delete*": "key policy: key administration (aliases, imported material)",
    # Data-key families: S3, SNS and CloudWatch Logs call the variants (WithoutPlaintext, Pair) they need.
    "kms:GenerateDataKey*": "key policy: services that encrypt with the key choose the data-key variant",
    "kms:ReEncrypt*": "key policy: ReEncryptFrom/ReEncryptTo, used together when re-encrypting",
}

RESOURCE_STAR_ACTIONS: dict[str, str] = {
    "cloudwatch:PutMetricData": "no resource-level permission; the job's statement pins cloudwatch:namespace",
    "ecr:GetAuthorizationToken": "no resource-level permission; the token only lets a caller use ECR's API",
    "ec2:DescribeInstances": "Describe* calls have no resource-level permission",
    "ec2:DescribeInstanceStatus": "Describe* calls have no resource-level permission (Karpenter's health checks)",
    "ec2:DescribeInstanceTypes": "Describe* calls have no resource-level permission",
    "ec2:DescribeSubnets": "Describe* calls have no resource-level permission",
    "ec2:DescribeSecurityGroups": "Describe* calls have no resource-level permission",
    "ec2:DescribeImages": "Describe* calls have no resource-level permission",
    "ec2:DescribeLaunchTemplates": "Describe* calls have no resource-level permission",
    "ec2:DescribeAvailabilityZones": "Describe* calls have no resource-level permission",
    "ec2:DescribeSpotPriceHistory": "Describe* calls have no resource-level permission",
    "ec2:DescribeNetworkInterfaces": "Describe* calls have no resource-level permission (Lambda in a VPC)",
    "autoscaling:DescribeAutoScalingGroups": "Describe* calls have no resource-level permission",
    # The EKS tiers' cluster autoscaler and Karpenter discover capacity with these read-only calls.
    "autoscaling:DescribeAutoScalingInstances": "Describe* calls have no resource-level permission",
    "autoscaling:DescribeLaunchConfigurations": "Describe* calls have no resource-level permission",
    "autoscaling:DescribeScalingActivities": "Describe* calls have no resource-level permission",
    "autoscaling:DescribeTags": "Describe* calls have no resource-level permission",
    "ec2:DescribeLaunchTemplateVersions": "Describe* calls have no resource-level permission",
    "ec2:DescribeCapacityReservations": "Describe* calls have no resource-level permission",
    "ec2:DescribeInstanceTypeOfferings": "Describe* calls have no resource-level permission",
    "ec2:DescribePlacementGroups": "Describe* calls have no resource-level permission",
    "ec2:GetInstanceTypesFromInstanceRequirements": "a read-only lookup with no resource-level permission",
    "iam:ListInstanceProfiles": "IAM authorises List* calls only on Resource *; Karpenter lists instance "
    "profiles to garbage-collect the ones it made (its reference policy's AllowUnscopedInstanceProfileListAction)",
    "ce:GetCostAndUsage": "Cost Explorer has no resource-level permission",
    "ce:GetCostForecast": "Cost Explorer has no resource-level permission",
    "pricing:GetProducts": "the Price List API has no resource-level permission",
    # Session Manager on the small tier's node (infra/components/spot_node.py): the message gateway's
    # channel actions have no resource-level permission (Service Authorization Reference, ssmmessages).
    "ssmmessages:CreateControlChannel": "Session Manager channel; no resource-level permission",
    "ssmmessages:CreateDataChannel": "Session Manager channel; no resource-level permission",
    "ssmmessages:OpenControlChannel": "Session Manager channel; no resource-level permission",
    "ssmmessages:OpenDataChannel": "Session Manager channel; no resource-level permission",
}

_ENDPOINT_PERIMETER = (
    "an interface endpoint's policy grants nothing (identity and resource policies still must); it limits what "
    "passes through the endpoint, and the endpoint-policies rule pins each statement to this account"
)
RESOURCE_STAR_DOCUMENTS: dict[str, str] = {
    "aws:kms/key:Key": 'in a key policy `Resource: "*"` means the key the policy is attached to',
    "aws:ec2/vpcEndpoint:VpcEndpoint": _ENDPOINT_PERIMETER,
}

WHOLE_SERVICE_DOCUMENTS: dict[str, str] = {
    "aws:ec2/vpcEndpoint:VpcEndpoint": _ENDPOINT_PERIMETER,
}

MANAGED_POLICIES: dict[str, str] = {
    "AmazonEKSClusterPolicy": "required by the EKS control plane's cluster role",
    "AmazonEKSWorkerNodePolicy": "required by EKS worker nodes to join the cluster",
    "AmazonEKS_CNI_Policy": "the VPC CNI's ENI management on worker nodes",
    "AmazonEC2ContainerRegistryReadOnly": "worker nodes pull system and job images from ECR",
}


def managed_policy_name(arn: str) -> str | None:
    """The name of an AWS-managed policy ARN (`arn:<partition>:iam::aws:policy/...`), else None."""
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "iam" and parts[4] == "aws" and parts[5].startswith("policy/"):
        return parts[5].rsplit("/", 1)[-1]
    return None
