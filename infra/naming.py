"""Names and cost-allocation tags, derived in one place from the project, the stack and its config."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.config import StackConfig

PROJECT = "llm-batch"
# The cost-allocation tags every taggable resource carries; activate them in the Billing console once.
COST_TAG_KEYS = ("CostCenter", "Project", "Stack", "Tier", "Owner", "Environment", "ManagedBy")
# The tag that tells one stack's spend from another's: the budget, anomaly monitor and cost report filter on
# it. Its value is the stack's full name (`stack_tag_value`), unique in an account where stacks of several
# projects may share a short name like "small".
STACK_TAG_KEY = "Stack"


def prefix(stack: str) -> str:
    """`llm-batch-<stack>`: the prefix of every physical name."""
    return f"{PROJECT}-{stack}"


def child(stack: str, suffix: str) -> str:
    """A child resource's name, `llm-batch-<stack>-<suffix>`."""
    return f"{prefix(stack)}-{suffix}"


def cost_tags(stack: str, config: StackConfig) -> dict[str, str]:
    """The provider's default tags: the required cost-allocation keys, then the stack's extra tags.

    Extra tags may add keys but never replace a required one (the config model rejects that).
    """
    tags = {
        "CostCenter": config.cost_center,
        "Project": PROJECT,
        STACK_TAG_KEY: stack_tag_value(stack),
        "Tier": config.tier,
        "Owner": config.owner,
        "Environment": config.environment,
        "ManagedBy": "pulumi",
    }
    return {**config.extra_tags, **tags}


def stack_tag_value(stack: str) -> str:
    """The value of the Stack tag: `llm-batch-<stack>`, this stack and no other."""
    return prefix(stack)


def log_group_prefix(stack: str) -> str:
    """What every CloudWatch Logs group of the stack is named under; the stack key serves only these."""
    return f"/{PROJECT}/{stack}/"


def eks_cluster_log_group(stack: str) -> str:
    """The log group EKS writes the control-plane logs of the stack's cluster (named `prefix(stack)`) to: a name
    EKS fixes, `/aws/eks/<cluster>/cluster`, outside the stack's prefix; the program declares it (retention, key)."""
    return f"/aws/eks/{prefix(stack)}/cluster"


def job_log_group(stack: str) -> str:
    """The CloudWatch Logs group the job writes to (the node's Docker log driver and the EKS pods)."""
    return f"{log_group_prefix(stack)}job"


def gpu_group_name(stack: str) -> str:
    """The small tier's Auto Scaling group: a fixed name the node's user data and the schedule can find."""
    return child(stack, "gpu")
