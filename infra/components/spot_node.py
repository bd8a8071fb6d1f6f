"""The small tier's compute: one Spot GPU node from a launch template, in an Auto Scaling group of 0 to 1.

The group sits at 0 while idle; the nightly run sets it to 1, the node runs the job from its user data and
sets it back to 0. Spot can take the node back; capacity rebalancing starts a replacement early and the job
resumes where the last one stopped. No SSH key and no inbound rule: operators use SSM Session Manager.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.iam import policy_document, service_trust
from infra.components.nightly import RUN_REQUEST_KEY
from infra.components.user_data import (
    DEFAULT_GRACE_PERIOD_S,
    BootSettings,
    failure_marker,
    render_user_data,
    stop_timeout_s,
)
from infra.config import StackConfig
from infra.statemachines import timing

if TYPE_CHECKING:
    from infra.components.foundation import Foundation

HTTPS = 443
ROOT_DEVICE = "/dev/xvda"  # Amazon Linux 2023 AMIs boot from xvda


@dataclass(frozen=True)
class SpotNodeArgs:
    stack: str
    context: AwsContext
    tags: Mapping[str, str]  # cost tags: the group and launched instances do not get the provider's defaults
    instance_type: str
    root_volume_gib: int
    ami_ssm_parameter: str
    max_spot_price: float | None
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[list[str]]
    key_arn: pulumi.Input[str]
    job_policy_arn: pulumi.Input[str]
    image: pulumi.Input[str]
    job_settings_secret_arn: pulumi.Input[str]
    hub_token_secret_arn: pulumi.Input[str]
    log_group_name: pulumi.Input[str]
    # s3://<bucket>/<output prefix with {date}>: where the boot script leaves `_failed.json` when it fails.
    output_prefix_uri: pulumi.Input[str]
    # The nightly run's request (nightly.RUN_REQUEST_KEY in the data bucket), holding the night's date.
    run_request_uri: pulumi.Input[str] = ""
    # The job's `resume.grace_period_s`: Docker waits longer than this between SIGTERM and SIGKILL.
    job_grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    # With the Batch API: how long the node waits for the queue's next run request (user_data.BootSettings).
    next_run_hold_s: int = 0

    @classmethod
    def from_config(
        cls, stack: str, config: StackConfig, context: AwsContext, tags: Mapping[str, str], base: Foundation
    ) -> SpotNodeArgs:
        """The small tier's node, on the foundation's network, image, secrets and job policy."""
        small, bucket = config.small, base.data.bucket_name
        return cls(
            stack=stack,
            context=context,
            tags=tags,
            instance_type=small.instance_type,
            root_volume_gib=small.root_volume_gib,
            ami_ssm_parameter=small.gpu_ami_ssm_parameter,
            max_spot_price=small.max_spot_price,
            vpc_id=base.network.vpc_id,
            subnet_ids=base.network.private_subnet_ids,
            key_arn=base.key.key_arn,
            job_policy_arn=base.job_access.policy_arn,
            image=base.image.image_ref,
            job_settings_secret_arn=base.secrets.job_settings_arn,
            hub_token_secret_arn=base.secrets.hub_token_arn,
            log_group_name=base.job_access.log_group_name,
            output_prefix_uri=bucket.apply(lambda name: f"s3://{name}/{config.job.output_prefix}"),
            run_request_uri=bucket.apply(lambda name: f"s3://{name}/{RUN_REQUEST_KEY}"),
            job_grace_period_s=config.job_grace_period_s,
            # With the Batch API the machine drains its queue on this boot: wait for its next run request.
            next_run_hold_s=(
                timing.next_run_hold_s(config.schedule.run_deadline_minutes) if config.batch_api.enabled else 0
            ),
        )


def session_manager_statements(context: AwsContext) -> list[dict[str, Any]]:
    """Only what SSM Agent needs for Session Manager (AWS's minimal instance permissions for it, as in the
    managed AWSCloud9SSMInstanceProfile): register the instance and open the session channels. Not
    AmazonSSMManagedInstanceCore, which also reads every SSM parameter and document in the account and
    runs Run Command and patching, none of which this node uses, and which the container could reach."""
    return [
        {
            "Sid": "RegisterWithSessionManager",
            "Effect": "Allow",
            "Action": ["ssm:UpdateInstanceInformation"],
            "Resource": context.arn("ec2", "instance/*"),
        },
        {
            "Sid": "SessionChannels",
            "Effect": "Allow",
            "Action": [
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Resource": "*",
        },
    ]


def stand_down_statements(partition: str, group_arn: str, output_prefix_uri: str) -> list[dict[str, Any]]:
    """What the boot script itself does when it ends: set its own group to 0, and on a failure leave the
    night's `_failed.json` (reading it first, so a marker the job wrote with its reason is kept)."""
    marker = failure_marker(output_prefix_uri)
    marker_arn = f"arn:{partition}:s3:::{marker.bucket}/{marker.key('*')}"
    return [
        {
            "Sid": "ScaleOwnGroupToZero",
            "Effect": "Allow",
            "Action": ["autoscaling:SetDesiredCapacity"],
            "Resource": group_arn,
        },
        {
            "Sid": "RecordBootFailure",
            "Effect": "Allow",
            "Action": ["s3:PutObject", "s3:GetObject"],
            "Resource": marker_arn,
        },
    ]


class SpotNode(pulumi.ComponentResource):
    """`group_name`, `group_arn`, `launch_template_id`, `security_group_id`, `role_name`, `role_arn`."""

    group_name: pulumi.Output[str]
    group_arn: pulumi.Output[str]
    launch_template_id: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    role_name: pulumi.Output[str]
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: SpotNodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:spot_node:SpotNode", name, None, opts)
        # Before any resource: a grace period Spot's notice cannot cover stops the program, naming the key.
        stop_timeout_s(args.job_grace_period_s)
        child = pulumi.ResourceOptions(parent=self)
        group_name = naming.gpu_group_name(args.stack)
        context = args.context

        role = aws.iam.Role(
            f"{name}-role",
            name=naming.child(args.stack, "gpu-node"),
            assume_role_policy=service_trust(f"ec2.{context.dns_suffix}"),
            opts=child,
        )
        aws.iam.RolePolicyAttachment(f"{name}-job", role=role.name, policy_arn=args.job_policy_arn, opts=child)
        aws.iam.RolePolicy(
            f"{name}-session-manager",
            role=role.name,
            policy=policy_document(session_manager_statements(context)),
            opts=child,
        )
        group_arn_pattern = context.group_arn(group_name)
        aws.iam.RolePolicy(
            f"{name}-stand-down",
            role=role.name,
            policy=pulumi.Output.from_input(args.output_prefix_uri).apply(
                lambda uri: policy_document(stand_down_statements(context.partition, group_arn_pattern, uri))
            ),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(
            f"{name}-profile", name=naming.child(args.stack, "gpu-node"), role=role.name, opts=child
        )
        security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description="GPU node: no inbound; HTTPS out (ECR, model hub, AWS APIs)",
            vpc_id=args.vpc_id,
            ingress=[],
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    description="HTTPS to AWS APIs, ECR and the model hub",
                    protocol="tcp",
                    from_port=HTTPS,
                    to_port=HTTPS,
                    cidr_blocks=["0.0.0.0/0"],
                )
            ],
            tags={"Name": naming.child(args.stack, "gpu-node")},
            opts=child,
        )
        ami = aws.ssm.get_parameter(name=args.ami_ssm_parameter, opts=pulumi.InvokeOptions(parent=self))
        user_data = pulumi.Output.all(
            args.image,
            args.job_settings_secret_arn,
            args.hub_token_secret_arn,
            args.log_group_name,
            args.run_request_uri,
            args.output_prefix_uri,
        ).apply(
            lambda values: base64.b64encode(
                render_user_data(
                    BootSettings(
                        region=context.region,
                        image=values[0],
                        job_settings_secret_arn=values[1],
                        hub_token_secret_arn=values[2],
                        log_group=values[3],
                        group_name=group_name,
                        run_request_uri=values[4],
                        output_prefix_uri=values[5],
                        grace_period_s=args.job_grace_period_s,
                        next_run_hold_s=args.next_run_hold_s,
                    )
                ).encode()
            ).decode()
        )
        instance_tags = {**args.tags, "Name": naming.child(args.stack, "gpu-node")}
        template = aws.ec2.LaunchTemplate(
            f"{name}-template",
            name=naming.child(args.stack, "gpu-node"),
            description="llm-batch small tier GPU node",
            image_id=ami.value,
            instance_type=args.instance_type,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            vpc_security_group_ids=[security_group.id],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",  # IMDSv2 only
                # 2 hops: the job's container reaches the instance role through Docker's bridge.
                http_put_response_hop_limit=2,
                instance_metadata_tags="disabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type="gp3",
                        encrypted="true",
                        kms_key_id=args.key_arn,
                        delete_on_termination="true",
                    ),
                )
            ],
            user_data=user_data,
            update_default_version=True,
            # Instances and volumes an Auto Scaling group launches do not get the provider's default tags.
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=instance_tags)
                for kind in ("instance", "volume", "network-interface", "spot-instances-request")
            ],
            opts=child,
        )
        group = aws.autoscaling.Group(
            f"{name}-group",
            name=group_name,
            min_size=0,
            max_size=1,
            desired_capacity=0,
            vpc_zone_identifiers=args.subnet_ids,
            capacity_rebalance=True,
            health_check_type="EC2",
            mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
                instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                    on_demand_base_capacity=0,
                    on_demand_percentage_above_base_capacity=0,
                    # Price and capacity together: the pool least likely to be interrupted at a low price.
                    spot_allocation_strategy="price-capacity-optimized",
                    spot_max_price=None if args.max_spot_price is None else str(args.max_spot_price),
                ),
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                        launch_template_id=template.id, version="$Latest"
                    ),
                    overrides=[
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                            instance_type=args.instance_type
                        )
                    ],
                ),
            ),
            tags=[
                aws.autoscaling.GroupTagArgs(key=key, value=value, propagate_at_launch=True)
                for key, value in sorted(instance_tags.items())
            ],
            # The nightly run owns the desired capacity; `pulumi up` must not reset a running job to 0.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["desiredCapacity"]),
        )
        self.group_name = group.name
        self.group_arn = group.arn
        self.launch_template_id = template.id
        self.security_group_id = security_group.id
        self.role_name = role.name
        self.role_arn = role.arn
        self.register_outputs({"group_name": self.group_name, "launch_template_id": self.launch_template_id})
