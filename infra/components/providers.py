"""The AWS providers every resource is created through, carrying the cost-allocation tags as default tags."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

BILLING_REGION = "us-east-1"  # AWS publishes EstimatedCharges (billing metrics) only in us-east-1.


@dataclass(frozen=True)
class ProvidersArgs:
    region: str
    tags: dict[str, str]


class Providers(pulumi.ComponentResource):
    """`aws`: the stack's region; `billing`: us-east-1 for billing metrics. Both tag every resource."""

    aws: aws.Provider
    billing: aws.Provider

    def __init__(self, name: str, args: ProvidersArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:providers:Providers", name, None, opts)
        default_tags = aws.ProviderDefaultTagsArgs(tags=args.tags)
        child = pulumi.ResourceOptions(parent=self)
        self.aws = aws.Provider(f"{name}-aws", region=args.region, default_tags=default_tags, opts=child)
        self.billing = aws.Provider(f"{name}-aws-billing", region=BILLING_REGION, default_tags=default_tags, opts=child)
        self.register_outputs({})
