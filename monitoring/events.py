"""EventBridge patterns routed to the stack's alerts topic.

A Spot interruption warning gives two minutes: the job commits its finished shards and a rerun resumes, so
the warning is information for the operator, not a page. EC2 events carry no tags, so the rule sees every
Spot instance of the account in the stack's region; the message names the instance.
"""

from __future__ import annotations

from typing import Any

SPOT_INTERRUPTION_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"

SPOT_INTERRUPTION_PATTERN: dict[str, Any] = {
    "source": ["aws.ec2"],
    "detail-type": [SPOT_INTERRUPTION_DETAIL_TYPE],
}

# EventBridge input transformer: a readable line for the e-mail instead of the raw event JSON.
SPOT_INTERRUPTION_INPUT_PATHS = {
    "instance": "$.detail.instance-id",
    "action": "$.detail.instance-action",
    "region": "$.region",
    "time": "$.time",
}
SPOT_INTERRUPTION_INPUT_TEMPLATE = (
    '"Spot interruption warning at <time>: instance <instance> in <region> will be <action> in two minutes. '
    'The job commits finished shards; the next run resumes the rest."'
)
