"""The permissions boundary on every IAM role the program creates, applied in one place: a stack transform.

The deployer may create roles and write their policies (docs/deployer-policy.json), so without a boundary it
could make a role with any policy and pass it to Lambda or EC2: more than it holds itself. The deployer policy
therefore allows those writes only on roles that carry this boundary, and this transform gives every
`aws:iam/role:Role` it, so no component can forget it. A real engine also runs stack transforms on the children
of remote components (pulumi_eks's cluster role); the offline plan never sees those children (mocks answer for
the component whole), so its tests cover the program's own roles only.

The boundary policy itself (docs/role-boundary.json) is created once by an administrator (docs/deploy.md), not by
this program: a deployer that could write it could widen it.
"""

from __future__ import annotations

import pulumi

from infra import naming
from infra.aws_context import AwsContext

# The one place the boundary's name is written; the deployer policy and the docs take it from here.
BOUNDARY_POLICY_NAME = f"{naming.PROJECT}-role-boundary"
ROLE_TYPE = "aws:iam/role:Role"
# The wire name of aws.iam.Role's `permissions_boundary` input, which is what a transform's props carry.
BOUNDARY_PROPERTY = "permissionsBoundary"


def boundary_arn(context: AwsContext) -> str:
    """The boundary policy's ARN in the caller's account (a managed policy has no region)."""
    return context.arn("iam", f"policy/{BOUNDARY_POLICY_NAME}", region=False)


def boundary_transform(arn: str) -> pulumi.ResourceTransform:
    """A transform setting `arn` as the permissions boundary of every IAM role, replacing any other value (the
    deployer could not create a role with another boundary anyway)."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if args.type_ != ROLE_TYPE:
            return None
        return pulumi.ResourceTransformResult(props={**args.props, BOUNDARY_PROPERTY: arn}, opts=args.opts)

    return transform


def require_boundary(context: AwsContext) -> None:
    """Register the transform for every role created after this call (call it before any component)."""
    pulumi.runtime.register_resource_transform(boundary_transform(boundary_arn(context)))
