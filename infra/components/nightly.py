"""The nightly run: an EventBridge Scheduler schedule starts a Step Functions state machine that brings up
GPU capacity, runs the job on the night's input and always releases the capacity; a second schedule sweeps
idle capacity away when no run is going (a guard for a run that died without releasing).

small: the state machine scales the tier's Auto Scaling group (1, then 0) and watches the job's markers in S3.
medium/large: it drives a function inside the VPC that submits the RayJob through the (private) API server,
follows it and releases the GPU nodes. The definitions are data: infra/statemachines/*.asl.json.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import naming, statemachines
from infra.aws_context import AwsContext
from infra.components.batch_api import (
    BATCH_INPUT_PREFIX,
    BATCH_OUTPUT_PREFIX,
    submit_function_name,
    tick_function_name,
)
from infra.components.iam import function_identity, policy_document, service_role
from infra.components.nightly_roles import (
    RUN_REQUEST_KEY,
    run_statements,
    scheduler_statements,
    submitter_statements,
    sweep_statements,
)
from infra.config import StackConfig
from infra.statemachines import timing
from infra.statemachines.queue import with_queue

FUNCTION_DIR = Path(__file__).resolve().parent.parent / "functions" / "submit_rayjob"
#: Kubernetes group the submit function's access entry maps to (bound below to what it needs).
SUBMITTER_GROUP = "llm-batch-nightly"
SUBMIT_TIMEOUT_S = 60  # the submit function's own bound on each call (submit, capacity_up, status, release)
MAX_ATTEMPTS = 3  # a run interrupted more often than this is reported, not retried forever
SWEEP_EVERY = f"rate({timing.SWEEP_MINUTES} minutes)"
LAMBDA_RUNTIME = "python3.12"


@dataclass(frozen=True)
class EksTarget:
    """Where the medium and large tiers' nightly RayJob goes."""

    cluster_name: str
    endpoint: pulumi.Input[str]
    certificate_authority: pulumi.Input[str]  # base64 PEM, as EKS reports it
    namespace: str
    provider: k8s.Provider
    private_subnet_ids: pulumi.Input[Sequence[str]]
    submitter_security_group_id: pulumi.Input[str]
    night_template_json: pulumi.Input[str]  # infra.nightly_template.night_template_json
    # What the submitter's access and RBAC must wait for: EKS rejects an access entry while the cluster is
    # creating, and the API server a Role in a namespace that does not exist yet.
    cluster: pulumi.Resource
    namespace_resource: pulumi.Resource
    nodegroup_name: str | None = None  # managed GPU group (medium); None: Karpenter (large)
    gpu_nodes: int = 0
    karpenter_nodepool: str | None = None


@dataclass(frozen=True)
class NightlyArgs:
    stack: str
    context: AwsContext
    cron: str
    timezone: str
    enabled: bool
    run_deadline_minutes: int
    input_prefix: str  # with {date}
    output_prefix: str
    bucket_name: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    alerts_topic_arn: pulumi.Input[str]
    log_retention_days: int = 30
    group_name: str | None = None  # small tier: the GPU Auto Scaling group
    eks: EksTarget | None = None
    # batch_api.enabled: (the batches' input prefix, their output prefix) the run also finds and watches
    batch_prefixes: tuple[str, str] | None = None
    # batch_api.enabled: the Batch API's tick function, which runs the queue (infra/statemachines/queue.py) and
    # takes the schedule's nights into it (workload/batch_api/nights.py)
    queue_function: str | None = None

    def __post_init__(self) -> None:
        if (self.group_name is None) == (self.eks is None):
            raise ValueError("NightlyArgs needs exactly one of group_name (small) or eks (medium, large)")


def nightly_args(
    config: StackConfig,
    stack: str,
    context: AwsContext,
    *,
    bucket_name: pulumi.Input[str],
    key_arn: pulumi.Input[str],
    alerts_topic_arn: pulumi.Input[str],
    eks: EksTarget | None = None,
) -> NightlyArgs:
    """The component's arguments from the stack's config: the small tier's group, or the EKS target."""
    return NightlyArgs(
        stack=stack,
        context=context,
        cron=config.schedule.cron,
        timezone=config.schedule.timezone,
        enabled=config.schedule.enabled,
        run_deadline_minutes=config.schedule.run_deadline_minutes,
        input_prefix=config.job.input_prefix,
        output_prefix=config.job.output_prefix,
        bucket_name=bucket_name,
        key_arn=key_arn,
        alerts_topic_arn=alerts_topic_arn,
        log_retention_days=config.monitoring.log_retention_days,
        group_name=naming.gpu_group_name(stack) if config.tier == "small" else None,
        eks=eks,
        batch_prefixes=(BATCH_INPUT_PREFIX, BATCH_OUTPUT_PREFIX) if config.batch_api.enabled else None,
        queue_function=tick_function_name(stack) if config.batch_api.enabled else None,
    )


def ca_of(kubeconfig_json: str) -> str:
    """The cluster CA (base64 PEM) written in a kubeconfig (pulumi-eks's, one cluster)."""
    document = json.loads(kubeconfig_json)
    return str(document["clusters"][0]["cluster"]["certificate-authority-data"])


class Nightly(pulumi.ComponentResource):
    """Outputs: the nightly state machine's ARN and the schedule's name."""

    state_machine_arn: pulumi.Output[str]
    schedule_name: pulumi.Output[str]

    def __init__(self, name: str, args: NightlyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:nightly:Nightly", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        context, stack = args.context, args.stack
        bucket_arn = context.bucket_arn(args.bucket_name)
        group_arn = context.group_arn(args.group_name) if args.group_name else None
        function_arn: pulumi.Output[str] | None = None
        if args.eks is not None:
            function_arn = self._submit_function(name, args, args.eks)

        # The run's deadline is enforced inside the definition (so the release runs); the machine's own
        # timeout is only a backstop after it, and the sweep releases what such a timeout leaves.
        deadline_s = args.run_deadline_minutes * 60
        poll_s = timing.poll_seconds(args.run_deadline_minutes)
        base: dict[str, statemachines.Substitution] = {
            "Stack": stack,
            "InputPrefix": statemachines.format_template(args.input_prefix, "job.input_prefix"),
            "OutputPrefix": statemachines.format_template(args.output_prefix, "job.output_prefix"),
            "PollSeconds": poll_s,
            "MaxPolls": timing.max_polls(args.run_deadline_minutes),
            "MaxAttempts": MAX_ATTEMPTS,
            "RunDeadlineMinutes": args.run_deadline_minutes,
            "StateMachineTimeoutSeconds": deadline_s + 1800,
        }
        kind = "asg" if args.group_name else "eks"
        queue_arn = context.arn("lambda", f"function:{args.queue_function}") if args.queue_function else None
        target = pulumi.Output.all(args.bucket_name, args.alerts_topic_arn, function_arn or "")

        def nightly_definition(values: list[str]) -> str:
            bucket, topic, function = values
            subs: dict[str, statemachines.Substitution] = {**base, "DataBucket": bucket, "AlertsTopic": topic}
            if kind == "asg":
                subs.update(AutoScalingGroup=str(args.group_name), RunRequestKey=RUN_REQUEST_KEY)
            else:
                subs["SubmitFunction"] = function
            definition = statemachines.render(statemachines.NIGHTLY[kind], subs)
            if queue_arn is not None:
                budget = timing.QUEUE_POLL_BUDGET
                queue = {"TickFunction": queue_arn, "MaxPolls": base["MaxPolls"], "QueuePollBudget": budget}
                definition = with_queue(definition, queue, timing.queue_timeout_s(args.run_deadline_minutes))
            return json.dumps(definition, indent=2)

        run_role = service_role(
            f"{name}-run",
            role_name=naming.child(stack, "nightly-run"),
            service=f"states.{context.dns_suffix}",
            account_id=context.account_id,
            policy=pulumi.Output.all(bucket_arn, args.key_arn, args.alerts_topic_arn, function_arn or "").apply(
                lambda v: policy_document(
                    run_statements(
                        bucket_arn=v[0],
                        key_arn=v[1],
                        topic_arn=v[2],
                        input_prefix=args.input_prefix,
                        output_prefix=args.output_prefix,
                        group_arn=group_arn,
                        function_arn=v[3] or None,
                        batch_prefixes=args.batch_prefixes,
                        queue_arn=queue_arn,
                    )
                )
            ),
            opts=child,
        )
        machine = aws.sfn.StateMachine(
            f"{name}-run",
            name=naming.child(stack, "nightly"),
            role_arn=run_role.arn,
            definition=target.apply(nightly_definition),
            opts=child,
        )

        sweep_role = service_role(
            f"{name}-sweep",
            role_name=naming.child(stack, "gpu-sweep"),
            service=f"states.{context.dns_suffix}",
            account_id=context.account_id,
            policy=pulumi.Output.all(machine.arn, args.key_arn, args.alerts_topic_arn, function_arn or "").apply(
                lambda v: policy_document(
                    sweep_statements(
                        nightly_arn=v[0],
                        key_arn=v[1],
                        topic_arn=v[2],
                        group_arn=group_arn,
                        function_arn=v[3] or None,
                    )
                )
            ),
            opts=child,
        )

        def sweep_definition(values: list[str]) -> str:
            nightly, topic, function = values
            subs: dict[str, statemachines.Substitution] = {
                "Stack": stack,
                "AlertsTopic": topic,
                "NightlyStateMachine": nightly,
            }
            if kind == "asg":
                subs["AutoScalingGroup"] = str(args.group_name)
            else:
                subs["SubmitFunction"] = function
            return statemachines.render_json(statemachines.SWEEP[kind], subs)

        sweep = aws.sfn.StateMachine(
            f"{name}-sweep",
            name=naming.child(stack, "gpu-sweep"),
            role_arn=sweep_role.arn,
            definition=pulumi.Output.all(machine.arn, args.alerts_topic_arn, function_arn or "").apply(
                sweep_definition
            ),
            opts=child,
        )

        scheduler_role = service_role(
            f"{name}-scheduler",
            role_name=naming.child(stack, "nightly-scheduler"),
            service=f"scheduler.{context.dns_suffix}",
            account_id=context.account_id,
            policy=pulumi.Output.all(machine.arn, sweep.arn).apply(
                lambda arns: policy_document(scheduler_statements(arns, queue_arn))
            ),
            opts=child,
        )
        # With the Batch API the night is one more entry of its queue (workload/batch_api/nights.py), so it never
        # races a batch's run: the schedule hands its time to the tick function, which starts the night at once
        # when nothing runs, or leaves it to the running execution's NextBatch.
        night_target = (
            {"arn": queue_arn, "input": json.dumps({"enqueue_night": "<aws.scheduler.scheduled-time>"})}
            if queue_arn is not None
            # The state machine takes the night's date from this (UTC) time.
            else {"arn": machine.arn, "input": json.dumps({"scheduled_time": "<aws.scheduler.scheduled-time>"})}
        )
        schedule = aws.scheduler.Schedule(
            f"{name}-schedule",
            name=naming.child(stack, "nightly"),
            description=f"llm-batch {stack}: the nightly batch run",
            schedule_expression=args.cron,
            schedule_expression_timezone=args.timezone,
            state="ENABLED" if args.enabled else "DISABLED",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            target=aws.scheduler.ScheduleTargetArgs(
                arn=night_target["arn"],
                role_arn=scheduler_role.arn,
                input=night_target["input"],
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                    maximum_retry_attempts=3, maximum_event_age_in_seconds=3600
                ),
            ),
            opts=child,
        )
        aws.scheduler.Schedule(
            f"{name}-sweep-schedule",
            name=naming.child(stack, "gpu-sweep"),
            description=f"llm-batch {stack}: release GPU capacity no nightly run is using",
            schedule_expression=SWEEP_EVERY,
            state="ENABLED",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            target=aws.scheduler.ScheduleTargetArgs(
                arn=sweep.arn,
                role_arn=scheduler_role.arn,
                input="{}",
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(maximum_retry_attempts=0),
            ),
            opts=child,
        )
        self.state_machine_arn = machine.arn
        self.schedule_name = schedule.name
        self.register_outputs({"state_machine_arn": machine.arn, "schedule_name": schedule.name})

    def _submit_function(self, name: str, args: NightlyArgs, eks: EksTarget) -> pulumi.Output[str]:
        """The RayJob submitter inside the VPC, its role, its access to the cluster and its RBAC."""
        child = pulumi.ResourceOptions(parent=self)
        context, stack = args.context, args.stack
        function_name = submit_function_name(stack)
        identity = function_identity(
            f"{name}-submit",
            stack=stack,
            function="submit-rayjob",
            lambda_service=f"lambda.{context.dns_suffix}",
            account_id=context.account_id,
            key_arn=args.key_arn,
            log_retention_days=args.log_retention_days,
            policy=lambda log_group_arn: log_group_arn.apply(
                lambda log_arn: policy_document(
                    submitter_statements(
                        context=context,
                        log_group_arn=log_arn,
                        cluster_name=eks.cluster_name,
                        nodegroup_name=eks.nodegroup_name,
                    )
                )
            ),
            opts=child,
        )
        logs, role = identity.log_group, identity.role
        # The API server maps the role to a group; RBAC below gives that group exactly what the function does.
        entry = aws.eks.AccessEntry(
            f"{name}-submit-access",
            cluster_name=eks.cluster_name,
            principal_arn=role.arn,
            kubernetes_groups=[SUBMITTER_GROUP],
            type="STANDARD",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[eks.cluster]),
        )
        k8s_child = pulumi.ResourceOptions(parent=self, provider=eks.provider)
        in_namespace = pulumi.ResourceOptions(
            parent=self,
            provider=eks.provider,
            depends_on=[eks.namespace_resource],
        )
        k8s.rbac.v1.Role(
            f"{name}-submit-rbac",
            metadata={"name": SUBMITTER_GROUP, "namespace": eks.namespace},
            rules=[
                {
                    "apiGroups": ["ray.io"],
                    "resources": ["rayjobs"],
                    "verbs": ["create", "get", "list", "delete"],
                },
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "list", "delete"]},
            ],
            opts=in_namespace,
        )
        k8s.rbac.v1.RoleBinding(
            f"{name}-submit-rbac-binding",
            metadata={"name": SUBMITTER_GROUP, "namespace": eks.namespace},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SUBMITTER_GROUP},
            subjects=[{"kind": "Group", "name": SUBMITTER_GROUP, "apiGroup": "rbac.authorization.k8s.io"}],
            opts=in_namespace,
        )
        if eks.karpenter_nodepool is not None:
            k8s.rbac.v1.ClusterRole(
                f"{name}-submit-nodeclaims",
                metadata={"name": f"{SUBMITTER_GROUP}-nodeclaims"},
                rules=[{"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list", "delete"]}],
                opts=k8s_child,
            )
            k8s.rbac.v1.ClusterRoleBinding(
                f"{name}-submit-nodeclaims-binding",
                metadata={"name": f"{SUBMITTER_GROUP}-nodeclaims"},
                role_ref={
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{SUBMITTER_GROUP}-nodeclaims",
                },
                subjects=[{"kind": "Group", "name": SUBMITTER_GROUP, "apiGroup": "rbac.authorization.k8s.io"}],
                opts=k8s_child,
            )
        code = pulumi.Output.from_input(eks.night_template_json).apply(
            lambda template: pulumi.AssetArchive(
                {
                    "handler.py": pulumi.FileAsset(str(FUNCTION_DIR / "handler.py")),
                    "night_template.json": pulumi.StringAsset(template),
                }
            )
        )
        environment = {
            "CLUSTER_NAME": eks.cluster_name,
            "API_SERVER": eks.endpoint,
            "CLUSTER_CA": eks.certificate_authority,
            "NAMESPACE": eks.namespace,
            "CAPACITY_MODE": "nodegroup" if eks.nodegroup_name else "karpenter",
            "NODEGROUP": eks.nodegroup_name or "",
            "GPU_NODES": str(eks.gpu_nodes),
            "KARPENTER_NODEPOOL": eks.karpenter_nodepool or "",
        }
        function = aws.lambda_.Function(
            f"{name}-submit",
            name=function_name,
            role=role.arn,
            runtime=LAMBDA_RUNTIME,
            handler="handler.handler",
            code=code,
            timeout=SUBMIT_TIMEOUT_S,
            memory_size=256,
            kms_key_arn=args.key_arn,
            environment=aws.lambda_.FunctionEnvironmentArgs(variables=environment),
            vpc_config=aws.lambda_.FunctionVpcConfigArgs(
                subnet_ids=eks.private_subnet_ids, security_group_ids=[eks.submitter_security_group_id]
            ),
            logging_config=aws.lambda_.FunctionLoggingConfigArgs(log_format="Text", log_group=logs.name),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[entry, logs]),
        )
        return function.arn
