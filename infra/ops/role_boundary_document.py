"""The permissions boundary policy (docs/role-boundary.json) that every role the stacks create carries.

    python -m infra.ops.deployer_policy            # writes it with the deployer policy
    python -m infra.ops.deployer_policy --check    # exit 1 when it is stale

Its form: allow everything, then deny identity and account administration. A role's effective permissions are its
own policies intersected with the boundary, so the role's policies (which the gate checks, scoped to the stack)
keep it least-privileged; the boundary's job is only to cap what the deployer could give a role it creates. A
boundary that restated each role's actions would have to change with every policy, and a missing action would
break the stack at run time, not at plan time. What it stops: a role creating or widening roles, users, groups
and policies (a way past the boundary), passing a role that is not the project's, and touching Organizations or
the account. What it leaves: a role made with a broad policy could still use other services' resources in the
account (docs/security.md); the gate's `iam` rules refuse such a policy in the plan.

Karpenter's controller creates instance profiles for its nodes and passes the project's node role to EC2: those
calls are not denied. EKS's cluster policy creates service-linked roles: not denied either.
"""

from __future__ import annotations

from typing import Any

from infra.ops.deployer_actions import PROJECT, PROJECT_TAG
from infra.ops.stacks import ROOT

DOCUMENT = ROOT / "docs" / "role-boundary.json"

# Writes to IAM identities and policies: with any of them a role could make or widen a principal without the
# boundary. Listed, not `iam:*`, so reads (and Karpenter's instance-profile calls) stay open.
IDENTITY_WRITES = (
    "iam:CreateRole",
    "iam:DeleteRole",
    "iam:UpdateRole",
    "iam:UpdateAssumeRolePolicy",
    "iam:PutRolePolicy",
    "iam:DeleteRolePolicy",
    "iam:AttachRolePolicy",
    "iam:DetachRolePolicy",
    "iam:PutRolePermissionsBoundary",
    "iam:DeleteRolePermissionsBoundary",
    "iam:TagRole",
    "iam:UntagRole",
    "iam:CreateUser",
    "iam:UpdateUser",
    "iam:PutUserPolicy",
    "iam:AttachUserPolicy",
    "iam:PutUserPermissionsBoundary",
    "iam:DeleteUserPermissionsBoundary",
    "iam:CreateAccessKey",
    "iam:UpdateAccessKey",
    "iam:CreateLoginProfile",
    "iam:UpdateLoginProfile",
    "iam:CreateGroup",
    "iam:AddUserToGroup",
    "iam:PutGroupPolicy",
    "iam:AttachGroupPolicy",
    "iam:CreatePolicy",
    "iam:CreatePolicyVersion",
    "iam:DeletePolicy",
    "iam:DeletePolicyVersion",
    "iam:SetDefaultPolicyVersion",
    "iam:CreateOpenIDConnectProvider",
    "iam:UpdateOpenIDConnectProviderThumbprint",
    "iam:AddClientIDToOpenIDConnectProvider",
    "iam:CreateSAMLProvider",
    "iam:UpdateSAMLProvider",
    "iam:UpdateAccountPasswordPolicy",
)


def boundary_document() -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            # The role's own policies decide what it may do; the boundary only removes what follows.
            {"Sid": "RolesOwnPoliciesDecide", "Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Sid": "DenyIdentityWrites", "Effect": "Deny", "Action": list(IDENTITY_WRITES), "Resource": "*"},
            {
                # A role that is not the project's carries no boundary: handing it on would escape this one.
                "Sid": "DenyPassingOtherRoles",
                "Effect": "Deny",
                "Action": "iam:PassRole",
                "Resource": "*",
                "Condition": {"StringNotEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT}},
            },
            {
                "Sid": "DenyOrganizationsAndAccount",
                "Effect": "Deny",
                "Action": ["organizations:*", "account:*"],
                "Resource": "*",
            },
        ],
    }
