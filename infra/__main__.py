"""The Pulumi program: load the stack's config, build one component per concern, export what operators need.

Pulumi runs `main: infra/` with infra/ as the working directory and on sys.path, so the repository root is
put on sys.path to import the `infra` and `workload` packages by their full names.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import aws_context, naming
from infra.components.alerts import Alerts, AlertsArgs
from infra.components.cost_controls import CostControls, CostControlsArgs
from infra.components.kms import EncryptionKey, EncryptionKeyArgs
from infra.components.providers import Providers, ProvidersArgs
from infra.components.storage import DataBucket, DataBucketArgs
from infra.config import from_pulumi

stack = pulumi.get_stack()
config = from_pulumi()

providers = Providers("providers", ProvidersArgs(region=config.region, tags=naming.cost_tags(stack, config)))
aws_opts = pulumi.ResourceOptions(provider=providers.aws)
context = aws_context.lookup(providers.aws)

key = EncryptionKey("kms", EncryptionKeyArgs(stack=stack, context=context), aws_opts)
data = DataBucket(
    "storage",
    DataBucketArgs(
        stack=stack,
        context=context,
        key_arn=key.key_arn,
        glacier_after_days=config.storage.glacier_after_days,
        noncurrent_expire_days=config.storage.noncurrent_expire_days,
        archive_prefixes=config.storage.archive_prefixes,
        force_destroy=config.storage.force_destroy,
    ),
    aws_opts,
)
alerts = Alerts(
    "alerts",
    AlertsArgs(stack=stack, context=context, key_arn=key.key_arn, email=config.alert_email),
    aws_opts,
)
CostControls(
    "cost", CostControlsArgs.from_config(stack, config, context, alerts.topic_arn, key.key_arn), aws_opts
)

pulumi.export("tier", config.tier)
pulumi.export("region", config.region)
pulumi.export("kms_key_arn", key.key_arn)
pulumi.export("data_bucket", data.bucket_name)
pulumi.export("alerts_topic_arn", alerts.topic_arn)
