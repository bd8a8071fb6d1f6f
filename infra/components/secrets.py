"""Secrets Manager, encrypted with the stack's key: the job's settings (model, engine), the hub token and, with
the online endpoint, its API keys (read by the endpoint's replicas; infra/components/foundation.py keeps them out
of the job's role).

Values only ever travel as Pulumi secrets: the state file encrypts them and `infra.plan` masks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import naming
from infra.config import StackConfig
from infra.pricing import stack_costs
from workload.contract.config import render_config

# A destroyed stack's secret names stay reserved this long; short, so a stack can be recreated soon after.
RECOVERY_WINDOW_DAYS = 7


@dataclass(frozen=True)
class JobSecretsArgs:
    stack: str
    key_arn: pulumi.Input[str]
    # The YAML the job reads (workload.contract.config.render_config): model source, engine and sampling settings.
    job_settings: pulumi.Input[str]
    # The Hugging Face hub token from `pulumi config set --secret llm-batch:hub_token`; None: set it by hand.
    hub_token: pulumi.Input[str] | None = None
    # The endpoint's API keys secret's name (serve.api_keys_secret_name or its default); None: no endpoint. Created
    # without a value: keys never pass through Pulumi's state; the operator puts them (docs/serve.md).
    serve_api_keys_name: str | None = None

    @classmethod
    def from_config(
        cls, stack: str, config: StackConfig, key_arn: pulumi.Input[str], bucket_name: pulumi.Output[str]
    ) -> JobSecretsArgs:
        """The job's settings rendered for this stack's bucket; the hub token from the stack's secret config."""
        job_settings = bucket_name.apply(
            lambda bucket: render_config(
                config.job_config(
                    f"s3://{bucket}/{config.job.input_prefix}",
                    f"s3://{bucket}/{config.job.output_prefix}",
                    stack=stack,
                    price_per_hour_usd=stack_costs.run_price_per_hour_usd(config),
                )
            )
        )
        # The online endpoint's keys only: the Batch API has a secret of its own (infra/components/batch_api.py).
        keyed = config.serve.enabled
        return cls(
            stack=stack,
            key_arn=key_arn,
            job_settings=job_settings,
            hub_token=pulumi.Config().get_secret("hub_token"),
            serve_api_keys_name=serve_api_keys_name(stack, config.serve.api_keys_secret_name) if keyed else None,
        )


def serve_api_keys_name(stack: str, configured: str | None) -> str:
    return configured or f"{naming.prefix(stack)}/serve-api-keys"


class JobSecrets(pulumi.ComponentResource):
    """`job_settings_arn`, `hub_token_arn` and `serve_api_keys_arn` (None without an endpoint): what the job's role
    may read, nothing else."""

    job_settings_arn: pulumi.Output[str]
    hub_token_arn: pulumi.Output[str]
    serve_api_keys_arn: pulumi.Output[str] | None

    def __init__(self, name: str, args: JobSecretsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmbatch:secrets:JobSecrets", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        settings = aws.secretsmanager.Secret(
            f"{name}-job-settings",
            name=f"{naming.prefix(args.stack)}/job-settings",
            description="The batch job's config (model, engine, sampling), rendered from stack config",
            kms_key_id=args.key_arn,
            recovery_window_in_days=RECOVERY_WINDOW_DAYS,
            opts=child,
        )
        aws.secretsmanager.SecretVersion(
            f"{name}-job-settings",
            secret_id=settings.id,
            secret_string=pulumi.Output.secret(args.job_settings),
            opts=child,
        )
        token = aws.secretsmanager.Secret(
            f"{name}-hub-token",
            name=f"{naming.prefix(args.stack)}/hub-token",
            description="Model hub (Hugging Face) token for gated models; empty when none is needed",
            kms_key_id=args.key_arn,
            recovery_window_in_days=RECOVERY_WINDOW_DAYS,
            opts=child,
        )
        if args.hub_token is not None:
            aws.secretsmanager.SecretVersion(
                f"{name}-hub-token",
                secret_id=token.id,
                secret_string=pulumi.Output.secret(args.hub_token),
                opts=child,
            )
        self.serve_api_keys_arn = None
        if args.serve_api_keys_name is not None:
            self.serve_api_keys_arn = aws.secretsmanager.Secret(
                f"{name}-serve-api-keys",
                name=args.serve_api_keys_name,
                description="API keys of the online endpoint, one per line or JSON {keys: [...]}; set by the operator",
                kms_key_id=args.key_arn,
                recovery_window_in_days=RECOVERY_WINDOW_DAYS,
                opts=child,
            ).arn
        self.job_settings_arn = settings.arn
        self.hub_token_arn = token.arn
        self.register_outputs(
            {
                "job_settings_arn": self.job_settings_arn,
                "hub_token_arn": self.hub_token_arn,
                "serve_api_keys_arn": self.serve_api_keys_arn,
            }
        )
