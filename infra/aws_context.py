"""Who and where the program deploys: looked up from the caller identity, never written as literals."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class AwsContext:
    account_id: str
    partition: str
    region: str
    dns_suffix: str

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        """An ARN in this account and region, e.g. arn("logs", "log-group:/x")."""
        return (
            f"arn:{self.partition}:{service}:{self.region if region else ''}:"
            f"{self.account_id if account else ''}:{resource}"
        )

    def bucket_arn(self, bucket_name: pulumi.Input[str]) -> pulumi.Output[str]:
        """The ARN of a bucket (S3 bucket ARNs name no region or account)."""
        return pulumi.Output.from_input(bucket_name).apply(lambda name: f"arn:{self.partition}:s3:::{name}")

    def group_arn(self, group_name: str) -> str:
        """The ARN pattern of an Auto Scaling group by its name (its id part is unknown until it exists)."""
        return self.arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{group_name}")

    @property
    def ecr_registry(self) -> str:
        """This account's private ECR registry host in the region."""
        return f"{self.account_id}.dkr.ecr.{self.region}.{self.dns_suffix}"

    @property
    def root_principal(self) -> str:
        return f"arn:{self.partition}:iam::{self.account_id}:root"


# EC2 Auto Scaling launches instances (and creates their encrypted volumes) as this service-linked role.
AUTOSCALING_SERVICE_ROLE = "AWSServiceRoleForAutoScaling"


def service_linked_role_arn(provider: aws.Provider, role_name: str = AUTOSCALING_SERVICE_ROLE) -> str:
    """The ARN of a service-linked role, read from the account (its path differs per service).

    AWS creates the Auto Scaling role the first time a group is made in an account; on a brand-new account
    create it once first: `aws iam create-service-linked-role --aws-service-name autoscaling.amazonaws.com`
    (docs/small-tier.md). A key policy naming a role that does not exist is refused, so it is looked up, not
    written as a literal.
    """
    return aws.iam.get_role(name=role_name, opts=pulumi.InvokeOptions(provider=provider)).arn


def lookup(provider: aws.Provider) -> AwsContext:
    """The caller's account and partition and the provider's region (data sources, read at deploy time)."""
    opts = pulumi.InvokeOptions(provider=provider)
    identity = aws.get_caller_identity(opts=opts)
    partition = aws.get_partition(opts=opts)
    region = aws.get_region(opts=opts)
    return AwsContext(
        account_id=identity.account_id,
        partition=partition.partition,
        region=region.region,
        dns_suffix=partition.dns_suffix,
    )
