"""The Batch API's AWS front (docs/batch-api.md, "On the AWS tiers"): an API Gateway HTTP API whose one route,
`$default`, goes to a Lambda function running workload/batch_api/lambda_front.py (Mangum over the app), and a
second function on a schedule, the queue's `tick`. Each has a role of its own (issue 60), both held to the bucket's
`batch-api/` prefix and the stack key: the internet-facing function's also reads the Batch API's own key secret
(`llm-batch-<stack>/batch-api-keys`, apart from the online endpoint's) and may invoke the tick function, and
nothing else (a cancel asks the tick, asynchronously, to stop the run); the tick's drives the one nightly state
machine (start, follow, stop) and the release of its GPUs, reads no key, and alone sends the batches' events
(issue 63, workload/batch_api/event_delivery.py): `events:PutEvents` on the stack's default event bus only, and
the keys' webhooks from their own secret (`llm-batch-<stack>/batch-api-webhooks`). Each logs to a group of its own on
the stack key, and the API's access log to another. The queue's metrics (queued, running, failed, expired
batches) are Embedded Metric Format lines in those groups (workload/batch_api/queue_metrics.py says why EMF): no
CloudWatch permission beyond writing the logs.

Why `$default` and no authoriser: the key check is the app's own (`workload/auth`), so every request but
`/health` is refused with OpenAI's 401 in the function, the same answer locally and on AWS; the policy gate's
rules (infra/rules/checks_batch_api.py) hold that every route goes to this function and that the endpoint, which
an HTTP API always puts on the internet, is acknowledged in the stack's config.

The code is built by `python tools/lambda_bundle.py` into build/batch-api-lambda/ (requirements/lambda.lock's
wheels for python3.12 on arm64, plus the front's workload packages); `pulumi up` refuses to run without it.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.aws_context import AwsContext
from infra.components.iam import FunctionIdentity, function_identity, policy_document, service_role, via_services
from infra.config import StackConfig
from infra.k8s.rayjob import termination_grace_s
from infra.statemachines import timing
from workload.contract import entrypoint
from workload.contract.adapter_config import served_names
from workload.contract.batch_api_quotas import BatchApiQuotas
from workload.contract.config import ResumeConfig

ROOT = Path(__file__).resolve().parent.parent.parent
BUNDLE_DIR = ROOT / "build" / "batch-api-lambda"
LOCK = ROOT / "requirements" / "lambda.lock"
LAMBDA_RUNTIME = "python3.12"
PYTHON_VERSION = "3.12"
ARCHITECTURE = (
    "arm64"  # Graviton: about 20% less per GB-second than x86_64, and the front has no native code of its own
)
# The wheels' tags for Lambda's arm64 runtime (Amazon Linux 2023, glibc 2.34): every manylinux glibc from the lock's
# target, 2.28 (tools/locks.py), down to manylinux2014's 2.17. pip takes a `manylinux_2_X` platform literally (it
# widens only the legacy manylinux2014 and 2010 names), and Pillow 13 ships manylinux_2_28 aarch64 wheels alone.
PIP_PLATFORMS = (*(f"manylinux_2_{minor}_aarch64" for minor in range(28, 16, -1)), "manylinux2014_aarch64")
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
# The executor's own default (a job at the default grace period on the small tier); from_config sets the stack's.
STOP_WAIT_S = entrypoint.stop_timeout_s(ResumeConfig().grace_period_s)
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


def submit_function_name(stack: str) -> str:
    """The EKS tiers' nightly submit function's name, known before it exists (infra/components/nightly.py creates
    it by this name): the front invokes its `release` after a stop."""
    return naming.child(stack, "submit-rayjob")


def stop_wait_s(tier: str, grace_period_s: float) -> int:
    """How long a cancelled or expired batch's stopped run is waited for before the batch closes without its
    partial files (issue 59, finding 6), from the stack's job grace period.

    Small tier: the executor sets the GPU group to 0 itself, so the node's SIGTERM reaches the job at once and
    `docker stop` gives it its grace period and the run spec's margin. EKS tiers: the executor invokes the submit
    function's release (the RayJob deleted at once); the bound covers that invocation failing too, when only the GPU
    sweep deletes the RayJob, and then the pods' termination grace (infra/statemachines/timing.py eks_stop_wait_s),
    never less than that grace.
    """
    if tier == "small":
        return entrypoint.stop_timeout_s(grace_period_s)
    return timing.eks_stop_wait_s(termination_grace_s(grace_period_s))


def schedule_expression(minutes: int) -> str:
    return "rate(1 minute)" if minutes == 1 else f"rate({minutes} minutes)"


def _api_storage(bucket_arn: str, key_arn: str, log_group_arn: str, *services: str) -> list[dict[str, Any]]:
    """What both functions share: their log group, the records and files under `batch-api/`, the stack key."""
    return [
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
            "Sid": "UseStackKey",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
            "Resource": key_arn,
            "Condition": via_services(key_arn, *services),
        },
    ]


def front_statements(
    *, bucket_arn: str, key_arn: str, keys_secret_arn: str, log_group_arn: str, tick_function_arn: str
) -> list[dict[str, Any]]:
    """The internet-facing function (issue 60): its records and files, the Batch API's own key secret, and an
    asynchronous invoke of the tick (its cancel); it can neither start nor stop an execution."""
    return [
        *_api_storage(bucket_arn, key_arn, log_group_arn, "s3", "secretsmanager"),
        {
            "Sid": "ReadApiKeys",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": keys_secret_arn,
        },
        {
            # A cancel asks the tick to stop the run (workload/batch_api/lambda_front.py `stop_by_tick`).
            "Sid": "AskTheTick",
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": tick_function_arn,
        },
    ]


def tick_statements(
    *,
    bucket_arn: str,
    key_arn: str,
    state_machine_arn: str,
    log_group_arn: str,
    group_arn: str | None,
    release_function_arn: str | None = None,
    event_bus_arn: str | None = None,
    webhooks_secret_arn: str | None = None,
) -> list[dict[str, Any]]:
    """The scheduled function: the queue's records under `batch-api/` and one machine's executions; no API key.
    It sends the batches' events (issue 63): PutEvents on the default bus alone (an action whose resource is the
    bus), and the webhooks' own secret."""
    executions = state_machine_arn.replace(":stateMachine:", ":execution:", 1) + ":*"
    key_services = ("s3", "secretsmanager") if webhooks_secret_arn else ("s3",)
    statements: list[dict[str, Any]] = [
        *_api_storage(bucket_arn, key_arn, log_group_arn, *key_services),
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
    if event_bus_arn is not None:
        statements.append(
            {"Sid": "SendBatchEvents", "Effect": "Allow", "Action": "events:PutEvents", "Resource": event_bus_arn}
        )
    if webhooks_secret_arn is not None:
        statements.append(
            {
                "Sid": "ReadWebhooks",
                "Effect": "Allow",
                "Action": "secretsmanager:GetSecretValue",
                "Resource": webhooks_secret_arn,
            }
        )
    if release_function_arn is not None:
        # The EKS tiers' counterpart: the nightly submit function's `release` deletes the stopped run's RayJob.
        statements.append(
            {
                "Sid": "ReleaseRayJob",
                "Effect": "Allow",
                "Action": "lambda:InvokeFunction",
                "Resource": release_function_arn,
            }
        )
    return statements


def keys_secret_name(stack: str) -> str:
    """The Batch API's own key secret, apart from the online endpoint's (issue 60)."""
    return f"{naming.prefix(stack)}/batch-api-keys"


def webhooks_secret_name(stack: str) -> str:
    """Each key's webhook and signing secret (issue 63, workload/batch_api/webhooks.py): read by the tick only."""
    return f"{naming.prefix(stack)}/batch-api-webhooks"


@dataclass(frozen=True)
class BatchApiArgs:
    stack: str
    context: AwsContext
    bucket_name: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    state_machine_arn: pulumi.Input[str]
    model_name: str
    code: pulumi.Archive
    metrics_namespace: str  # monitoring.metrics_namespace: the queue's metrics go where the stack's alarms read
    log_retention_days: int
    tick_minutes: int = 5
    memory_mb: int = 1024
    tick_reserved_concurrency: int = 1  # batch_api.tick_reserved_concurrency: ticks at once (reserved concurrency)
    http_reserved_concurrency: int = 20  # batch_api.http_reserved_concurrency: requests served at once
    quotas: BatchApiQuotas = field(default_factory=BatchApiQuotas)  # batch_api.quotas: LLM_BATCH_QUOTA_* to the front
    pool_batches: int = 1  # batch_api.pool_batches: batches sharing one run (LLM_BATCH_POOL_BATCHES)
    group_name: str | None = None  # the small tier's GPU group; None on EKS (release_function)
    # How long a stopped run's partial files are waited for (LLM_BATCH_STOP_WAIT_S, workload/batch_api/sfn_executor.py).
    stop_wait_s: int = STOP_WAIT_S
    # The EKS tiers' nightly submit function (named before it exists, as the tick is): a stop invokes its release.
    release_function: str | None = None
    # batch_api.public_endpoint_acknowledged: carried on the API as PUBLIC_ENDPOINT_TAG, which the gate reads.
    public_endpoint_acknowledged: bool = False
    # Every name a batch's lines may give as `model` (GET /v1/models): the job's model, aliases and LoRA adapters.
    served_models: tuple[str, ...] = ()
    # The largest `vision` upload (LLM_BATCH_MAX_IMAGE_BYTES): the job's input.max_image_bytes. None: none served.
    max_image_bytes: int | None = None

    @classmethod
    def from_config(
        cls,
        stack: str,
        config: StackConfig,
        context: AwsContext,
        bucket_name: pulumi.Input[str],
        key_arn: pulumi.Input[str],
        state_machine_arn: pulumi.Input[str],
        code: pulumi.Archive,
    ) -> BatchApiArgs:
        job = config.job_config("s3://b/in/{date}/", "s3://b/out/{date}/", stack=stack)
        return cls(
            stack=stack,
            context=context,
            bucket_name=bucket_name,
            key_arn=key_arn,
            state_machine_arn=state_machine_arn,
            # The served name is the job's: a batch's `model` must match what the nightly job loads.
            model_name=job.model.name,
            served_models=served_names(job.model),
            # A batch's uploaded images reach the job through its pool spec (workload/batch_api/pools.py), and the
            # job bounds each image it reads by this same setting: the front keeps none larger.
            max_image_bytes=job.input.max_image_bytes,
            code=code,
            metrics_namespace=config.monitoring.metrics_namespace,
            log_retention_days=config.monitoring.log_retention_days,
            tick_minutes=config.batch_api.tick_minutes,
            memory_mb=config.batch_api.memory_mb,
            tick_reserved_concurrency=config.batch_api.tick_reserved_concurrency,
            http_reserved_concurrency=config.batch_api.http_reserved_concurrency,
            quotas=config.batch_api.quotas,
            pool_batches=config.batch_api.pool_batches,
            group_name=naming.gpu_group_name(stack) if config.tier == "small" else None,
            stop_wait_s=stop_wait_s(config.tier, job.resume.grace_period_s),
            release_function=None if config.tier == "small" else submit_function_name(stack),
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
        release_arn = context.arn("lambda", f"function:{args.release_function}") if args.release_function else None
        keys = aws.secretsmanager.Secret(
            f"{name}-keys",
            name=keys_secret_name(stack),
            description="The Batch API's keys (docs/batch-api.md, Keys): NAME KEY [admin] lines or JSON; set by the "
            "operator, never by Pulumi; read by the HTTP function only",
            kms_key_id=args.key_arn,
            recovery_window_in_days=7,  # as the stack's other secrets (infra/components/secrets.py)
            opts=child,
        )
        webhooks = aws.secretsmanager.Secret(
            f"{name}-webhooks",
            name=webhooks_secret_name(stack),
            description="Each Batch API key's webhook (docs/batch-api.md, Events and webhooks): NAME URL whsec_SECRET "
            "lines or JSON; set by the operator, never by Pulumi; read by the tick function only",
            kms_key_id=args.key_arn,
            recovery_window_in_days=7,
            opts=child,
        )
        # The stack's default bus: every batch state change is an event there (workload/batch_api/events.py).
        event_bus_arn = context.arn("events", "event-bus/default")
        tick_arn = context.arn("lambda", f"function:{tick_function_name(stack)}")
        # Two roles (issue 60): the tick's drives executions and reads no key; the internet-facing function's
        # reads the keys and may only ask the tick (one function, asynchronously) to stop a cancelled run.
        # Both functions' roles and log groups alike but for their policies.
        identity = functools.partial(
            function_identity,
            stack=stack,
            lambda_service=f"lambda.{context.dns_suffix}",
            account_id=context.account_id,
            key_arn=args.key_arn,
            log_retention_days=args.log_retention_days,
            opts=child,
        )
        tick_identity = identity(
            name,
            function="batch-api",
            policy=lambda log_group_arn: pulumi.Output.all(
                bucket_arn, args.key_arn, args.state_machine_arn, log_group_arn, webhooks.arn
            ).apply(
                lambda v: policy_document(
                    tick_statements(
                        bucket_arn=v[0],
                        key_arn=v[1],
                        state_machine_arn=v[2],
                        log_group_arn=v[3],
                        group_arn=group_arn,
                        release_function_arn=release_arn,
                        event_bus_arn=event_bus_arn,
                        webhooks_secret_arn=v[4],
                    )
                )
            ),
        )
        front_identity = identity(
            f"{name}-front",
            function="batch-api-front",
            policy=lambda log_group_arn: pulumi.Output.all(bucket_arn, args.key_arn, keys.arn, log_group_arn).apply(
                lambda v: policy_document(
                    front_statements(
                        bucket_arn=v[0],
                        key_arn=v[1],
                        keys_secret_arn=v[2],
                        log_group_arn=v[3],
                        tick_function_arn=tick_arn,
                    )
                )
            ),
        )
        environment = {
            "LLM_BATCH_BUCKET": args.bucket_name,
            "LLM_BATCH_API_PREFIX": API_PREFIX,
            "LLM_BATCH_KMS_KEY_ID": args.key_arn,
            "LLM_BATCH_STATE_MACHINE_ARN": args.state_machine_arn,
            "LLM_BATCH_MODEL": args.model_name,
            # GET /v1/models: the model, its aliases and LoRA adapters (workload/batch_api/lambda_front.py).
            "LLM_BATCH_SERVED_MODELS": ",".join(args.served_models or (args.model_name,)),
            "LLM_BATCH_GPU_GROUP": args.group_name or "",
            "LLM_BATCH_STOP_WAIT_S": str(args.stop_wait_s),
            "LLM_BATCH_RELEASE_FUNCTION": release_arn or "",
            # The queue's metrics (workload/batch_api/queue_metrics.py), printed as EMF lines to the log group.
            "LLM_BATCH_STACK": stack,
            "LLM_BATCH_METRICS_NAMESPACE": args.metrics_namespace,
            **args.quotas.env(),  # each key's quotas (workload/batch_api/quotas.py)
            "LLM_BATCH_POOL_BATCHES": str(args.pool_batches),  # batches sharing one run (workload/batch_api/pools.py)
            # Where the batches' events go (workload/batch_api/events.py): both functions record them with the
            # changes they write; only the tick sends, so only its role may put events or read the webhooks.
            "LLM_BATCH_EVENT_BUS": event_bus_arn,
            "LLM_BATCH_WEBHOOKS_SECRET": webhooks.arn,
        }
        # Key scope, said here though it is the front's default: every key is a tenant of its own (issue 60).
        front_environment = {
            **environment,
            "LLM_BATCH_API_KEY_SECRET": keys.arn,
            "LLM_BATCH_API_SCOPE": "key",
            "LLM_BATCH_TICK_FUNCTION": tick_function_name(stack),
            # `vision` uploads (workload/batch_api/vision.py); unset, the front refuses them.
            **({"LLM_BATCH_MAX_IMAGE_BYTES": str(args.max_image_bytes)} if args.max_image_bytes else {}),
        }

        def function(
            suffix: str,
            handler: str,
            timeout: int,
            identity: FunctionIdentity,
            variables: dict[str, Any],
            reserved: int | None = None,
        ) -> aws.lambda_.Function:
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
                reserved_concurrent_executions=reserved,
                kms_key_arn=args.key_arn,
                environment=aws.lambda_.FunctionEnvironmentArgs(variables=variables),
                # Text: a printed line is the log event as printed, so an EMF line reaches CloudWatch Logs whole.
                logging_config=aws.lambda_.FunctionLoggingConfigArgs(
                    log_format="Text", log_group=identity.log_group.name
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[identity.log_group]),
            )

        # The most requests served at once (issue 60): with the API Gateway stage's throttle, what one caller can
        # take of the account's Lambda concurrency; preflight checks it against the account's quota.
        http = function(
            "http",
            HTTP_HANDLER,
            HTTP_TIMEOUT_S,
            front_identity,
            front_environment,
            reserved=args.http_reserved_concurrency,
        )
        # One tick at a time (issue 59): the schedule's tick, the nightly enqueue and the machine's NextBatch all
        # invoke this function, and two at once would each list the executions and start one. The GPU slot's
        # compare-and-swap (workload/batch_api/sfn_executor.py) already keeps that to one start; the reserved
        # concurrency keeps the ticks themselves from racing. A throttled invocation is retried, not lost: the
        # schedules invoke asynchronously, and Lambda keeps a throttled asynchronous event and retries it for up
        # to six hours (AWS Lambda Developer Guide, "Invoking a Lambda function asynchronously" and "Invoke a
        # Lambda function on a schedule", read 2026-12-06); the machine's NextBatch retries Lambda's
        # TooManyRequestsException past a whole tick (infra/statemachines/queue_drain.json).
        tick = function(
            "tick", TICK_HANDLER, TICK_TIMEOUT_S, tick_identity, environment, reserved=args.tick_reserved_concurrency
        )

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
