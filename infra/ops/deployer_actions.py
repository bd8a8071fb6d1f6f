"""The deployer's IAM actions per resource type, and the resources each service's actions are scoped to.

`ACTIONS` maps each type token the plans create to the create/read/update/delete/tag calls the AWS provider (or,
for remote components, the component's inner resources) makes for it; `infra.ops.deployer_policy` grants their
union and fails on a type this table lacks. `SCOPES` narrows each service's actions to the stack's resources:
by the `llm-batch-` name prefix every stack's names carry (`infra.naming`), or, where names are generated
(IAM roles, KMS keys), by the `Project` cost tag the provider's default tags put on everything. A service whose
resources are named by AWS-generated ids and whose tags the provider sets after creating (EC2, Cost Explorer,
CloudWatch Logs query definitions) keeps `*`; docs/deploy.md says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.role_boundary import BOUNDARY_POLICY_NAME

PREFIX = "llm-batch-"
PROJECT_TAG = "Project"
PROJECT = "llm-batch"

_EC2_TAGS = ("ec2:CreateTags", "ec2:DeleteTags")
_SG_RULES = (
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:AuthorizeSecurityGroupEgress",
    "ec2:RevokeSecurityGroupIngress",
    "ec2:RevokeSecurityGroupEgress",
    "ec2:ModifySecurityGroupRules",
    "ec2:UpdateSecurityGroupRuleDescriptionsIngress",
    "ec2:UpdateSecurityGroupRuleDescriptionsEgress",
)
_APIGATEWAY = ("apigateway:GET", "apigateway:POST", "apigateway:PATCH", "apigateway:PUT", "apigateway:DELETE")
_S3_READ = ("s3:ListBucket", "s3:GetBucket*", "s3:GetLifecycleConfiguration", "s3:GetEncryptionConfiguration")
_S3_READ_ALL = (
    *_S3_READ,
    "s3:GetAccelerateConfiguration",
    "s3:GetReplicationConfiguration",
    "s3:GetAnalyticsConfiguration",
    "s3:GetIntelligentTieringConfiguration",
    "s3:GetInventoryConfiguration",
    "s3:GetMetricsConfiguration",
)
_ROLE_READ = ("iam:GetRole", "iam:ListRolePolicies", "iam:ListAttachedRolePolicies")
_EKS_TAGS = ("eks:TagResource", "eks:UntagResource", "eks:ListTagsForResource")
# Calls on the stack's key that AWS makes as the caller when a resource names it: EBS volumes (RunInstances),
# ECR repositories, Lambda environment variables and Secrets Manager values. The key statement scopes them to
# keys tagged as the project's.
_KMS_EBS = (
    "kms:CreateGrant",
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
)

ACTIONS: Mapping[str, tuple[str, ...]] = {
    "aws:apigatewayv2/api:Api": _APIGATEWAY,
    "aws:apigatewayv2/integration:Integration": _APIGATEWAY,
    "aws:apigatewayv2/route:Route": _APIGATEWAY,
    "aws:apigatewayv2/stage:Stage": _APIGATEWAY,
    "aws:autoscaling/group:Group": (
        "autoscaling:CreateAutoScalingGroup",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:DeleteAutoScalingGroup",
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:DescribeScalingActivities",
        "autoscaling:CreateOrUpdateTags",
        "autoscaling:DeleteTags",
        "autoscaling:SetInstanceProtection",
        "ec2:RunInstances",  # the group launches from the stack's launch template as its caller
        "iam:PassRole",
    ),
    "aws:budgets/budget:Budget": (
        "budgets:ViewBudget",
        "budgets:ModifyBudget",
        "budgets:TagResource",
        "budgets:UntagResource",
        "budgets:ListTagsForResource",
    ),
    "aws:cloudwatch/dashboard:Dashboard": (
        "cloudwatch:PutDashboard",
        "cloudwatch:GetDashboard",
        "cloudwatch:DeleteDashboards",
    ),
    "aws:cloudwatch/eventRule:EventRule": (
        "events:PutRule",
        "events:DescribeRule",
        "events:DeleteRule",
        "events:EnableRule",
        "events:DisableRule",
        "events:TagResource",
        "events:UntagResource",
        "events:ListTagsForResource",
    ),
    "aws:cloudwatch/eventTarget:EventTarget": ("events:PutTargets", "events:RemoveTargets", "events:ListTargetsByRule"),
    "aws:cloudwatch/logGroup:LogGroup": (
        "logs:CreateLogGroup",
        "logs:DeleteLogGroup",
        "logs:DescribeLogGroups",
        "logs:PutRetentionPolicy",
        "logs:DeleteRetentionPolicy",
        "logs:AssociateKmsKey",
        "logs:DisassociateKmsKey",
        "logs:TagResource",
        "logs:UntagResource",
        "logs:ListTagsForResource",
        "logs:TagLogGroup",
        "logs:UntagLogGroup",
        "logs:ListTagsLogGroup",
    ),
    "aws:cloudwatch/metricAlarm:MetricAlarm": (
        "cloudwatch:PutMetricAlarm",
        "cloudwatch:DescribeAlarms",
        "cloudwatch:DeleteAlarms",
        "cloudwatch:TagResource",
        "cloudwatch:UntagResource",
        "cloudwatch:ListTagsForResource",
    ),
    "aws:cloudwatch/queryDefinition:QueryDefinition": (
        "logs:PutQueryDefinition",
        "logs:DescribeQueryDefinitions",
        "logs:DeleteQueryDefinition",
    ),
    "aws:costexplorer/anomalyMonitor:AnomalyMonitor": (
        "ce:CreateAnomalyMonitor",
        "ce:GetAnomalyMonitors",
        "ce:UpdateAnomalyMonitor",
        "ce:DeleteAnomalyMonitor",
        "ce:TagResource",
        "ce:UntagResource",
        "ce:ListTagsForResource",
    ),
    "aws:costexplorer/anomalySubscription:AnomalySubscription": (
        "ce:CreateAnomalySubscription",
        "ce:GetAnomalySubscriptions",
        "ce:UpdateAnomalySubscription",
        "ce:DeleteAnomalySubscription",
        "ce:TagResource",
        "ce:UntagResource",
        "ce:ListTagsForResource",
    ),
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": (*_SG_RULES, *_EC2_TAGS),
    "aws:ec2/instance:Instance": (
        "ec2:RunInstances",
        "ec2:TerminateInstances",
        "ec2:StartInstances",
        "ec2:StopInstances",
        "ec2:ModifyInstanceAttribute",
        "ec2:ModifyInstanceMetadataOptions",
        *_EC2_TAGS,
        *_KMS_EBS,  # its root volume is encrypted with the stack's key
    ),
    "aws:ec2/internetGateway:InternetGateway": (
        "ec2:CreateInternetGateway",
        "ec2:DeleteInternetGateway",
        "ec2:AttachInternetGateway",
        "ec2:DetachInternetGateway",
        *_EC2_TAGS,
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        "ec2:CreateLaunchTemplate",
        "ec2:CreateLaunchTemplateVersion",
        "ec2:ModifyLaunchTemplate",
        "ec2:DeleteLaunchTemplate",
        "ec2:GetLaunchTemplateData",
        *_EC2_TAGS,
    ),
    "aws:ec2/routeTable:RouteTable": (
        "ec2:CreateRouteTable",
        "ec2:DeleteRouteTable",
        "ec2:CreateRoute",
        "ec2:ReplaceRoute",
        "ec2:DeleteRoute",
        *_EC2_TAGS,
    ),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": (
        "ec2:AssociateRouteTable",
        "ec2:DisassociateRouteTable",
        "ec2:ReplaceRouteTableAssociation",
    ),
    "aws:ec2/securityGroup:SecurityGroup": (
        "ec2:CreateSecurityGroup",
        "ec2:DeleteSecurityGroup",
        *_SG_RULES,
        *_EC2_TAGS,
    ),
    "aws:ec2/subnet:Subnet": ("ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:ModifySubnetAttribute", *_EC2_TAGS),
    "aws:ec2/tag:Tag": _EC2_TAGS,
    "aws:ec2/vpc:Vpc": (
        "ec2:CreateVpc",
        "ec2:DeleteVpc",
        "ec2:ModifyVpcAttribute",
        "ec2:DescribeVpcAttribute",
        *_EC2_TAGS,
    ),
    "aws:ec2/vpcEndpoint:VpcEndpoint": (
        "ec2:CreateVpcEndpoint",
        "ec2:ModifyVpcEndpoint",
        "ec2:DeleteVpcEndpoints",
        *_EC2_TAGS,
    ),
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": (
        "ecr:PutLifecyclePolicy",
        "ecr:GetLifecyclePolicy",
        "ecr:DeleteLifecyclePolicy",
    ),
    "aws:ecr/repository:Repository": (
        "ecr:CreateRepository",
        "ecr:DeleteRepository",
        "ecr:DescribeRepositories",
        "ecr:PutImageTagMutability",
        "ecr:PutImageScanningConfiguration",
        "ecr:TagResource",
        "ecr:UntagResource",
        "ecr:ListTagsForResource",
        "kms:CreateGrant",  # a repository encrypted with the stack's key
        "kms:RetireGrant",
        "kms:DescribeKey",
    ),
    "aws:eks/accessEntry:AccessEntry": (
        "eks:CreateAccessEntry",
        "eks:DescribeAccessEntry",
        "eks:UpdateAccessEntry",
        "eks:DeleteAccessEntry",
        "eks:AssociateAccessPolicy",
        "eks:DisassociateAccessPolicy",
        "eks:ListAssociatedAccessPolicies",
        *_EKS_TAGS,
    ),
    "aws:eks/addon:Addon": (
        "eks:CreateAddon",
        "eks:DescribeAddon",
        "eks:DescribeAddonVersions",
        "eks:UpdateAddon",
        "eks:DeleteAddon",
        "eks:DescribeUpdate",
        "iam:PassRole",  # an add-on's service-account role
        *_EKS_TAGS,
    ),
    "aws:iam/instanceProfile:InstanceProfile": (
        "iam:CreateInstanceProfile",
        "iam:GetInstanceProfile",
        "iam:DeleteInstanceProfile",
        "iam:AddRoleToInstanceProfile",
        "iam:RemoveRoleFromInstanceProfile",
        "iam:TagInstanceProfile",
        "iam:UntagInstanceProfile",
        "iam:PassRole",
    ),
    "aws:iam/policy:Policy": (
        "iam:CreatePolicy",
        "iam:GetPolicy",
        "iam:GetPolicyVersion",
        "iam:ListPolicyVersions",
        "iam:CreatePolicyVersion",
        "iam:DeletePolicyVersion",
        "iam:DeletePolicy",
        "iam:TagPolicy",
        "iam:UntagPolicy",
    ),
    "aws:iam/role:Role": (
        "iam:CreateRole",
        *_ROLE_READ,
        "iam:ListInstanceProfilesForRole",
        "iam:UpdateRole",
        "iam:UpdateRoleDescription",
        "iam:UpdateAssumeRolePolicy",
        "iam:DeleteRole",
        "iam:TagRole",
        "iam:UntagRole",
        # A role's own inline and managed policy inputs, which the provider writes with the role.
        "iam:PutRolePolicy",
        "iam:GetRolePolicy",
        "iam:DeleteRolePolicy",
        "iam:AttachRolePolicy",
        "iam:DetachRolePolicy",
        "iam:PutRolePermissionsBoundary",  # a role made before the boundary existed gets it on its next update
    ),
    "aws:iam/rolePolicy:RolePolicy": ("iam:PutRolePolicy", "iam:GetRolePolicy", "iam:DeleteRolePolicy", *_ROLE_READ),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("iam:AttachRolePolicy", "iam:DetachRolePolicy", *_ROLE_READ),
    "aws:kms/alias:Alias": ("kms:CreateAlias", "kms:UpdateAlias", "kms:DeleteAlias", "kms:ListAliases"),
    "aws:kms/key:Key": (
        "kms:CreateKey",
        "kms:DescribeKey",
        "kms:GetKeyPolicy",
        "kms:PutKeyPolicy",
        "kms:GetKeyRotationStatus",
        "kms:EnableKeyRotation",
        "kms:DisableKeyRotation",
        "kms:UpdateKeyDescription",
        "kms:ScheduleKeyDeletion",
        "kms:TagResource",
        "kms:UntagResource",
        "kms:ListResourceTags",
    ),
    "aws:lambda/function:Function": (
        "lambda:CreateFunction",
        "lambda:GetFunction",
        "lambda:GetFunctionConfiguration",
        "lambda:GetFunctionCodeSigningConfig",
        "lambda:GetRuntimeManagementConfig",
        "lambda:ListVersionsByFunction",
        "lambda:UpdateFunctionCode",
        "lambda:UpdateFunctionConfiguration",
        "lambda:PutFunctionConcurrency",
        "lambda:DeleteFunctionConcurrency",
        "lambda:DeleteFunction",
        "lambda:TagResource",
        "lambda:UntagResource",
        "lambda:ListTags",
        "iam:PassRole",
        "kms:CreateGrant",  # environment variables encrypted with the stack's key, read back on refresh
        "kms:Encrypt",
        "kms:Decrypt",
    ),
    "aws:lambda/permission:Permission": ("lambda:AddPermission", "lambda:RemovePermission", "lambda:GetPolicy"),
    "aws:s3/bucket:Bucket": (
        "s3:CreateBucket",
        "s3:DeleteBucket",
        "s3:PutBucketTagging",
        "s3:GetBucketTagging",
        *_S3_READ_ALL,
    ),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ("s3:PutLifecycleConfiguration", *_S3_READ),
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": ("s3:PutBucketOwnershipControls", *_S3_READ),
    "aws:s3/bucketPolicy:BucketPolicy": ("s3:PutBucketPolicy", "s3:DeleteBucketPolicy", *_S3_READ),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": ("s3:PutBucketPublicAccessBlock", *_S3_READ),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "s3:PutEncryptionConfiguration",
        *_S3_READ,
    ),
    "aws:s3/bucketVersioning:BucketVersioning": ("s3:PutBucketVersioning", *_S3_READ),
    "aws:scheduler/schedule:Schedule": (
        "scheduler:CreateSchedule",
        "scheduler:GetSchedule",
        "scheduler:UpdateSchedule",
        "scheduler:DeleteSchedule",
        "iam:PassRole",
    ),
    "aws:secretsmanager/secret:Secret": (
        "secretsmanager:CreateSecret",
        "secretsmanager:DescribeSecret",
        "secretsmanager:UpdateSecret",
        "secretsmanager:DeleteSecret",
        "secretsmanager:GetResourcePolicy",
        "secretsmanager:TagResource",
        "secretsmanager:UntagResource",
    ),
    "aws:secretsmanager/secretVersion:SecretVersion": (
        "secretsmanager:PutSecretValue",
        "secretsmanager:GetSecretValue",  # the provider reads the version back to diff it
        "secretsmanager:UpdateSecretVersionStage",
        "secretsmanager:ListSecretVersionIds",
        "kms:GenerateDataKey",  # the value is encrypted with the stack's key
        "kms:Decrypt",
    ),
    "aws:sfn/stateMachine:StateMachine": (
        "states:CreateStateMachine",
        "states:DescribeStateMachine",
        "states:UpdateStateMachine",
        "states:DeleteStateMachine",
        "states:ListStateMachineVersions",
        "states:TagResource",
        "states:UntagResource",
        "states:ListTagsForResource",
        "iam:PassRole",
    ),
    "aws:sns/topic:Topic": (
        "sns:CreateTopic",
        "sns:GetTopicAttributes",
        "sns:SetTopicAttributes",
        "sns:DeleteTopic",
        "sns:TagResource",
        "sns:UntagResource",
        "sns:ListTagsForResource",
    ),
    "aws:sns/topicPolicy:TopicPolicy": ("sns:SetTopicAttributes", "sns:GetTopicAttributes"),
    "aws:sns/topicSubscription:TopicSubscription": (
        "sns:Subscribe",
        "sns:Unsubscribe",
        "sns:GetSubscriptionAttributes",
        "sns:SetSubscriptionAttributes",
    ),
    "aws:sqs/queue:Queue": (
        "sqs:CreateQueue",
        "sqs:GetQueueAttributes",
        "sqs:SetQueueAttributes",
        "sqs:DeleteQueue",
        "sqs:TagQueue",
        "sqs:UntagQueue",
        "sqs:ListQueueTags",
    ),
    "aws:sqs/queuePolicy:QueuePolicy": ("sqs:SetQueueAttributes", "sqs:GetQueueAttributes"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        "ec2:AuthorizeSecurityGroupIngress",
        "ec2:RevokeSecurityGroupIngress",
        "ec2:ModifySecurityGroupRules",
        "ec2:DescribeSecurityGroupRules",
        *_EC2_TAGS,
    ),
    # pulumi-eks remote components: the plan never shows their inner resources, so these list what those make.
    "eks:index:Cluster": (
        "eks:CreateCluster",
        "eks:DescribeCluster",
        "eks:UpdateClusterConfig",
        "eks:UpdateClusterVersion",
        "eks:AssociateEncryptionConfig",
        "eks:DescribeUpdate",
        "eks:DeleteCluster",
        *_EKS_TAGS,
        "ec2:CreateSecurityGroup",
        "ec2:DeleteSecurityGroup",
        *_SG_RULES,
        *_EC2_TAGS,
        "iam:CreateRole",
        *_ROLE_READ,
        "iam:DeleteRole",
        "iam:TagRole",
        "iam:AttachRolePolicy",
        "iam:DetachRolePolicy",
        "iam:PutRolePermissionsBoundary",
        "iam:PassRole",
        "iam:CreateOpenIDConnectProvider",
        "iam:GetOpenIDConnectProvider",
        "iam:UpdateOpenIDConnectProviderThumbprint",
        "iam:TagOpenIDConnectProvider",
        "iam:DeleteOpenIDConnectProvider",
        "kms:CreateGrant",  # EKS envelope-encrypts secrets with the stack's key
        "kms:DescribeKey",
        "ssm:GetParameter",
    ),
    "eks:index:ManagedNodeGroup": (
        "eks:CreateNodegroup",
        "eks:DescribeNodegroup",
        "eks:UpdateNodegroupConfig",
        "eks:UpdateNodegroupVersion",
        "eks:DeleteNodegroup",
        "eks:DescribeUpdate",
        *_EKS_TAGS,
        "ec2:RunInstances",
        "iam:PassRole",
        "ssm:GetParameter",
    ),
    "docker-build:index:Image": (
        "ecr:GetAuthorizationToken",
        "ecr:BatchCheckLayerAvailability",
        "ecr:InitiateLayerUpload",
        "ecr:UploadLayerPart",
        "ecr:CompleteLayerUpload",
        "ecr:PutImage",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "ecr:DescribeImages",
    ),
}

# Read-only look-ups the program makes (caller identity, region, the SSM GPU AMI parameter, route tables), and the
# list and describe calls every provider read makes: few services scope these to a resource, and they change nothing.
LOOKUPS: tuple[str, ...] = ("sts:GetCallerIdentity", "ssm:GetParameter", "ec2:Describe*", "iam:GetRole")

# Service prefix -> the ARNs its (non-read) actions may touch. `llm-batch-*` is every stack's name prefix.
NAMED: Mapping[str, tuple[str, ...]] = {
    "budgets": (f"arn:aws:budgets::*:budget/{PREFIX}*",),
    "cloudwatch": (f"arn:aws:cloudwatch:*:*:alarm:{PREFIX}*", "arn:aws:cloudwatch::*:dashboard/*"),
    "ecr": (f"arn:aws:ecr:*:*:repository/{PREFIX}*",),
    "events": ("arn:aws:events:*:*:rule/*",),  # spot-interruption rules are named, the EKS add-ons' are generated
    "lambda": (f"arn:aws:lambda:*:*:function:{PREFIX}*",),
    "logs": ("arn:aws:logs:*:*:log-group:/llm-batch/*",),
    "s3": (f"arn:aws:s3:::{PREFIX}*",),
    "scheduler": (f"arn:aws:scheduler:*:*:schedule/*/{PREFIX}*",),
    "secretsmanager": (f"arn:aws:secretsmanager:*:*:secret:{PREFIX}*",),
    "sns": (f"arn:aws:sns:*:*:{PREFIX}*",),  # covers subscriptions: <topic ARN>:<id>
    "sqs": (f"arn:aws:sqs:*:*:{PREFIX}*",),
    "states": (f"arn:aws:states:*:*:stateMachine:{PREFIX}*",),
    "apigateway": ("arn:aws:apigateway:*::/apis", "arn:aws:apigateway:*::/apis/*", "arn:aws:apigateway:*::/tags/*"),
    "autoscaling": (f"arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/{PREFIX}*",),
    # Clusters are named llm-batch-<stack>; node groups, add-ons and access entries sit under the cluster's name.
    "eks": tuple(f"arn:aws:eks:*:*:{kind}/{PREFIX}*" for kind in ("cluster", "nodegroup", "addon", "access-entry")),
    "ssm": ("arn:aws:ssm:*:*:parameter/aws/service/*",),  # the public AMI parameters only (account part empty)
}
TAGGED_PROJECT: Mapping[str, Any] = {"StringEquals": {f"aws:ResourceTag/{PROJECT_TAG}": PROJECT}}
REQUEST_PROJECT: Mapping[str, Any] = {"StringEquals": {f"aws:RequestTag/{PROJECT_TAG}": PROJECT}}
# The permissions boundary every stack role carries (infra/role_boundary.py), in the deployer's own account: the
# document names no account, and a role's boundary can only be a policy of its own account.
BOUNDARY_ARN = f"arn:aws:iam::${{aws:PrincipalAccount}}:policy/{BOUNDARY_POLICY_NAME}"
BOUNDARY_POLICY = f"arn:aws:iam::*:policy/{BOUNDARY_POLICY_NAME}"
# The role writes that could give a role more than the deployer holds: allowed only with the boundary on the role
# (AWS sets iam:PermissionsBoundary for exactly these calls).
BOUNDED_ROLE_WRITES = (
    "iam:CreateRole",
    "iam:PutRolePolicy",
    "iam:AttachRolePolicy",
    "iam:DetachRolePolicy",
    "iam:DeleteRolePolicy",
    "iam:PutRolePermissionsBoundary",
)
REQUIRE_BOUNDARY: Mapping[str, Any] = {"StringEquals": {"iam:PermissionsBoundary": BOUNDARY_ARN}}
# Writes that would loosen the boundary itself: never the deployer's, whatever else allows them (the boundary's
# name matches the llm-batch-* policies the deployer manages). The administrator creates it (docs/deploy.md).
BOUNDARY_WRITES = (
    "iam:CreatePolicy",
    "iam:CreatePolicyVersion",
    "iam:DeletePolicy",
    "iam:DeletePolicyVersion",
    "iam:SetDefaultPolicyVersion",
)
# Services whose resources are scoped by the Project tag rather than by name (generated names).
TAGGED: Mapping[str, tuple[str, ...]] = {
    "iam": ("arn:aws:iam::*:role/*",),
    "kms": ("arn:aws:kms:*:*:key/*",),
}
# Services left on `*`: EC2 names resources by generated ids and accepts tags only on some calls; Cost Explorer's
# anomaly resources take no resource ARN on create.
UNSCOPED = ("ec2", "ce")
# The services the stack's roles are handed to; PassRole is granted for these only.
PASSED_TO = (
    "ec2.amazonaws.com",
    "eks.amazonaws.com",
    "lambda.amazonaws.com",
    "scheduler.amazonaws.com",
    "states.amazonaws.com",
    "pods.eks.amazonaws.com",
)
# Service-linked roles the first deploy in an account creates (EKS, its node groups, Auto Scaling, spot).
SERVICE_LINKED = (
    "eks.amazonaws.com",
    "eks-nodegroup.amazonaws.com",
    "autoscaling.amazonaws.com",
    "spot.amazonaws.com",
)
# Calls that take no resource ARN (or that the program makes on resources it does not own).
ANYWHERE = (
    "sts:GetCallerIdentity",
    "eks:CreateCluster",  # takes no resource ARN; every later call on the cluster is scoped by its name
    "iam:GetRole",
    "ecr:GetAuthorizationToken",
    "ec2:GetLaunchTemplateData",
    "logs:PutQueryDefinition",
    "logs:DeleteQueryDefinition",
    # A subscription's calls take only its own ARN, which SNS generates; the topic calls stay scoped by name.
    "sns:Unsubscribe",
    "sns:GetSubscriptionAttributes",
    "sns:SetSubscriptionAttributes",
)
