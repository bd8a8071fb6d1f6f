"""The Batch API's AWS front (docs/batch-api.md, "On the AWS tiers"): an API Gateway HTTP API whose one route,
`$default`, goes to a Lambda function running workload/batch_api/lambda_front.py (Mangum over the app), and a
second function on a schedule, the queue's `tick`. Both run as one role that may touch only the bucket's
`batch-api/` prefix, the stack key (through S3 and Secrets Manager), the endpoint's key secret and the one nightly
state machine; both log to one group on the stack key, and the API's access log to another. The queue's metrics
(queued, running, failed, expired batches) are Embedded Metric Format lines in that group
(workload/batch_api/queue_metrics.py says why EMF): no CloudWatch permission beyond writing the logs.

Why `$default` and no authoriser: the key check is the app's own (`workload/auth`), so every request but
`/health` is refused with OpenAI's 401 in the function, the same answer locally and on AWS; the policy gate's
rules (infra/rules/checks_batch_api.py) hold that every route goes to this function and that the endpoint, which
an HTTP API always puts on the internet, is acknowledged in the stack's config.

The code is built by `python tools/lambda_bundle.py` into build/batch-api-lambda/ (requirements/lambda.lock's
wheels for python3.12 on arm64, plus the front's workload packages); `pulumi up` refuses to run without it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.iam import function_identity, policy_document, service_role, via_services
from infra.config import StackConfig

ROOT = Path(__file__).resolve().parent.parent.parent
BUNDLE_DIR = ROOT / "build" / "batch-api-lambda"
LOCK = ROOT / "requirements" / "lambda.lock"
LAMBDA_RUNTIME = "python3.12"
PYTHON_VERSION = "3.12"
ARCHITECTURE = (
    "arm64"  # Graviton: about 20% less per GB-second than x86_64, and the front has no native code of its own
)
PIP_PLATFORM = "manylinux2014_aarch64"  # the wheels' tag for Lambda's arm64 runtime (Amazon Linux 2023, glibc 2.34)
# What lambda_front imports of the repository (tests/test_layers.py: batch_api -> contract, auth).
FRONT_PACKAGES = ("workload/__init__.py", "workload/auth", "workload/batch_api", "workload/contract")
HTTP_HANDLER = "workload.batch_api.lambda_front.handler"
TICK_HANDLER = "workload.batch_api.lambda_front.tick"
API_PREFIX = "batch-api/"
# What a batch's run touches of the API's prefix (workload/batch_api/service.py's layout): the job and the nightly
# machine read its file and write or watch its output, and nothing else there (not the records, not the markers).
BATCH_INPUT_PREFIX = f"{API_PREFIX}files/"
BATCH_OUTPUT_PREFIX = f"{API_PREFIX}batches/*/output/"
HTTP_TIMEOUT_S = 29  # API Gateway's HTTP API waits at most 30 s for an integration
TICK_TIMEOUT_S = 120
# The stack's config said the internet may reach this API (infra/rules/checks_batch_api.py's `public-endpoints`).
PUBLIC_ENDPOINT_TAG = "llm-batch:public-endpoint"


def bundle_stamp() -> str:
    """What the built bundle records of the lock it was built from: a bundle of another lock is stale."""
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


def bundle_archive(plan_only: bool) -> pulumi.Archive:
    """The built bundle; a preview without one ships the front's sources alone and says so; an `up` refuses."""
    stamp = BUNDLE_DIR / ".lock-sha256"
    if stamp.is_file() and stamp.read_text() == bundle_stamp():
        return pulumi.FileArchive(str(BUNDLE_DIR))
    problem = "is not built" if not stamp.is_file() else "was built from another requirements/lambda.lock"
    if not plan_only:
        raise ValueError(f"{BUNDLE_DIR.relative_to(ROOT)} {problem}: run `python tools/lambda_bundle.py` first")
    pulumi.log.warn(f"batch_api: {BUNDLE_DIR.relative_to(ROOT)} {problem}; the plan shows the sources alone")
    assets: dict[str, Any] = {
        package: pulumi.FileArchive(str(ROOT / package))
        if (ROOT / package).is_dir()
        else pulumi.FileAsset(str(ROOT / package))
        for package in FRONT_PACKAGES
    }
    return pulumi.AssetArchive(assets)


def tick_function_name(stack: str) -> str:
    """The tick function's name, known before it exists: the nightly machine invokes it (its NextBatch step)
    and the nightly schedule queues the night through it, while the function's own settings name the machine."""
    return naming.child(stack, "batch-api-tick")


def schedule_expression(minutes: int) -> str:
    return "rate(1 minute)" if minutes == 1 else f"rate({minutes} minutes)"


def front_statements(
    *,
    bucket_arn: str,
    key_arn: str,
    keys_secret_arn: str,
    state_machine_arn: str,
    log_group_arn: str,
    group_arn: str | None,
) -> list[dict[str, Any]]:
    """What the front does: its records and files under `batch-api/`, the key secret, one machine's executions."""
    executions = state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":*"
    statements: list[dict[str, Any]] = [
        {
            "Sid": "WriteLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": f"{log_group_arn}:*",
        },
        {
            "Sid": "ListApiPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{API_PREFIX}*"]}},
        },
        {
            # Records (conditional writes), files and their multipart uploads, the job's output it reads back.
            "Sid": "ApiObjects",
            "Effect": "Allow",
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": f"{bucket_arn}/{API_PREFIX}*",
        },
        {
            "Sid": "ReadApiKeys",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": keys_secret_arn,
        },
        {
            "Sid": "UseStackKey",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
            "Resource": key_arn,
            "Condition": via_services(key_arn, "s3", "secretsmanager"),
        },
        {
            "Sid": "RunBatches",
            "Effect": "Allow",
            "Action": ["states:StartExecution", "states:ListExecutions"],
            "Resource": state_machine_arn,
        },
        {
            "Sid": "FollowBatches",
            "Effect": "Allow",
            "Action": ["states:DescribeExecution", "states:StopExecution"],
            "Resource": executions,
        },
    ]
    if group_arn is not None:
        # A stopped execution skips its release step: the executor sets the small tier's group to 0 itself.
        statements.append(
            {
                "Sid": "ReleaseGpuGroup",
                "Effect": "Allow",
                "Action": "autoscaling:SetDesiredCapacity",
                "Resource": group_arn,
            }
        )
    return statements


@dataclass(frozen=True)
class BatchApiArgs:
    stack: str
    context: AwsContext
    bucket_name: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    keys_secret_arn: pulumi.Input[str]
    state_machine_arn: pulumi.Input[str]
    model_name: str
    code: pulumi.Archive
    metrics_namespace: str  # monitoring.metrics_namespace: the queue's metrics go where the stack's alarms read
    log_retention_days: int
    tick_minutes: int = 5
    memory_mb: int = 1024
    group_name: str | None = None  # the small tier's GPU group; None on EKS (the GPU sweep releases nodes)
    # batch_api.public_endpoint_acknowledged: carried on the API as PUBLIC_ENDPOINT_TAG, which the gate reads.
    public_endpoint_acknowledged: bool = False

    @classmethod
    def from_config(
        cls,
        stack: str,
        config: StackConfig,
        context: AwsContext,
        bucket_name: pulumi.Input[str],
        key_arn: pulumi.Input[str],
        keys_secret_arn: pulumi.Input[str],
        state_machine_arn: pulumi.Input[str],
        code: pulumi.Archive,
    ) -> BatchApiArgs:
        return cls(
            stack=stack,
            context=context,
            bucket_name=bucket_name,
            key_arn=key_arn,
            keys_secret_arn=keys_secret_arn,
            state_machine_arn=state_machine_arn,
            # The served name is the job's: a batch's `model` must match what the nightly job loads.
            model_name=config.job_config("s3://b/in/{date}/", "s3://b/out/{date}/", stack=stack).model.name,
            code=code,
            metrics_namespace=config.monitoring.metrics_namespace,
            log_retention_days=config.monitoring.log_retention_days,
            tick_minutes=config.batch_api.tick_minutes,
            memory_mb=config.batch_api.memory_mb,
            group_name=naming.gpu_group_name(stack) if config.tier == "small" else None,
            public_endpoint_acknowledged=config.batch_api.public_endpoint_acknowledged,
        )


class BatchApi(pulumi.ComponentResource):
    """`url` (the API's endpoint: `OpenAI(base_url=f"{url}/v1")`), `tick_function_name` (infra.run --batch)."""

    url: pulumi.Output[str]
    tick_function_name: pulumi.Output[str]

    def __init__(self, name: str, args: BatchApiArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:batchapi:BatchApi", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        context, stack = args.context, args.stack
        bucket_arn = context.bucket_arn(args.bucket_name)
        group_arn = context.group_arn(args.group_name) if args.group_name else None
        identity = function_identity(
            name,
            stack=stack,
            function="batch-api",
            lambda_service=f"lambda.{context.dns_suffix}",
            account_id=context.account_id,
            key_arn=args.key_arn,
            log_retention_days=args.log_retention_days,
            policy=lambda log_group_arn: pulumi.Output.all(
                bucket_arn, args.key_arn, args.keys_secret_arn, args.state_machine_arn, log_group_arn
            ).apply(
                lambda v: policy_document(
                    front_statements(
                        bucket_arn=v[0],
                        key_arn=v[1],
                        keys_secret_arn=v[2],
                        state_machine_arn=v[3],
                        log_group_arn=v[4],
                        group_arn=group_arn,
                    )
                )
            ),
            opts=child,
        )
        environment = {
            "LLM_BATCH_BUCKET": args.bucket_name,
            "LLM_BATCH_API_PREFIX": API_PREFIX,
            "LLM_BATCH_KMS_KEY_ID": args.key_arn,
            "LLM_BATCH_STATE_MACHINE_ARN": args.state_machine_arn,
            "LLM_BATCH_API_KEY_SECRET": args.keys_secret_arn,
            "LLM_BATCH_MODEL": args.model_name,
            "LLM_BATCH_GPU_GROUP": args.group_name or "",
            # The queue's metrics (workload/batch_api/queue_metrics.py), printed as EMF lines to the log group.
            "LLM_BATCH_STACK": stack,
            "LLM_BATCH_METRICS_NAMESPACE": args.metrics_namespace,
        }

        def function(suffix: str, handler: str, timeout: int) -> aws.lambda_.Function:
            return aws.lambda_.Function(
                f"{name}-{suffix}",
                name=tick_function_name(stack) if suffix == "tick" else naming.child(stack, f"batch-api-{suffix}"),
                role=identity.role.arn,
                runtime=LAMBDA_RUNTIME,
                architectures=[ARCHITECTURE],
                handler=handler,
                code=args.code,
                timeout=timeout,
                memory_size=args.memory_mb,
                kms_key_arn=args.key_arn,
                environment=aws.lambda_.FunctionEnvironmentArgs(variables=environment),
                # Text: a printed line is the log event as printed, so an EMF line reaches CloudWatch Logs whole.
                logging_config=aws.lambda_.FunctionLoggingConfigArgs(
                    log_format="Text", log_group=identity.log_group.name
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[identity.log_group]),
            )

        http = function("http", HTTP_HANDLER, HTTP_TIMEOUT_S)
        tick = function("tick", TICK_HANDLER, TICK_TIMEOUT_S)

        access_logs = aws.cloudwatch.LogGroup(
            f"{name}-access-logs",
            name=f"{naming.log_group_prefix(stack)}batch-api-access",
            retention_in_days=args.log_retention_days,
            kms_key_id=args.key_arn,
            opts=child,
        )
        api = aws.apigatewayv2.Api(
            f"{name}-http",
            name=naming.child(stack, "batch-api"),
            protocol_type="HTTP",
            description=f"llm-batch {stack}: the OpenAI-compatible Batch API (keys checked by the function)",
            tags={PUBLIC_ENDPOINT_TAG: "acknowledged"} if args.public_endpoint_acknowledged else {},
            opts=child,
        )
        integration = aws.apigatewayv2.Integration(
            f"{name}-function",
            api_id=api.id,
            integration_type="AWS_PROXY",
            integration_uri=http.arn,
            payload_format_version="2.0",
            timeout_milliseconds=HTTP_TIMEOUT_S * 1000 + 500,
            opts=child,
        )
        aws.apigatewayv2.Route(
            f"{name}-default-route",
            api_id=api.id,
            route_key="$default",
            target=integration.id.apply(lambda integration_id: f"integrations/{integration_id}"),
            opts=child,
        )
        stage = aws.apigatewayv2.Stage(
            f"{name}-stage",
            api_id=api.id,
            name="$default",
            auto_deploy=True,
            access_log_settings=aws.apigatewayv2.StageAccessLogSettingsArgs(
                destination_arn=access_logs.arn,
                format=(
                    '{"requestId":"$context.requestId","ip":"$context.identity.sourceIp","time":"$context.requestTime",'
                    '"method":"$context.httpMethod","path":"$context.path","status":"$context.status",'
                    '"bytes":"$context.responseLength","error":"$context.integrationErrorMessage"}'
                ),
            ),
            # A cap on what a leaked key (or a flood of 401s) can cost: requests are billed whatever the answer.
            default_route_settings=aws.apigatewayv2.StageDefaultRouteSettingsArgs(
                throttling_burst_limit=100, throttling_rate_limit=50
            ),
            opts=child,
        )
        aws.lambda_.Permission(
            f"{name}-invoke-from-api",
            action="lambda:InvokeFunction",
            function=http.name,
            principal=f"apigateway.{context.dns_suffix}",
            source_arn=api.execution_arn.apply(lambda arn: f"{arn}/*/*"),
            opts=child,
        )
        scheduler_role = service_role(
            f"{name}-scheduler",
            role_name=naming.child(stack, "batch-api-scheduler"),
            service=f"scheduler.{context.dns_suffix}",
            account_id=context.account_id,
            policy=tick.arn.apply(
                lambda arn: policy_document(
                    [{"Sid": "Tick", "Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": arn}]
                )
            ),
            opts=child,
        )
        aws.scheduler.Schedule(
            f"{name}-tick-schedule",
            name=naming.child(stack, "batch-api-tick"),
            description=f"llm-batch {stack}: the Batch API queue's tick (start, follow, expire, sweep)",
            schedule_expression=schedule_expression(args.tick_minutes),
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            target=aws.scheduler.ScheduleTargetArgs(
                arn=tick.arn,
                role_arn=scheduler_role.arn,
                input="{}",
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(maximum_retry_attempts=0),
            ),
            opts=child,
        )
        self.url = stage.invoke_url.apply(lambda url: (url or "").rstrip("/"))  # the $default stage: the API's own URL
        self.tick_function_name = tick.name
        self.register_outputs({"url": self.url, "tick_function_name": self.tick_function_name})
