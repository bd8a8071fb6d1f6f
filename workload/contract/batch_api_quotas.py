"""What one key of the Batch API may hold, and how large a request may ask (issue 60): the quotas the stack's
config sets (`llm-batch:batch_api.quotas`), the front reads from its environment and the local server from flags.

One model for the three, so the stack's config, the function's settings and the service agree on every name.
The service's checks are in workload/batch_api/quotas.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field

from workload.contract.batch_api_priorities import PrioritiesMixin, parse_priorities, priorities_text

ENV_PREFIX = "LLM_BATCH_QUOTA_"
PRIORITIES = "priorities"  # the one field that is not a count: a mapping (batch_api_priorities.py)


class BatchApiQuotas(PrioritiesMixin):
    """Per key (per owner: the key's tenant in key scope, the project in project scope); defaults for a team
    sharing one GPU queue. Every count at least 1; the queue's priorities per key (PrioritiesMixin)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    open_batches: int = Field(
        20, ge=1, description="Batches queued or running at once (validating, in_progress, finalizing, cancelling)."
    )
    enqueued_requests: int = Field(
        500_000, ge=1, description="The requests of those batches together (ten of OpenAI's largest batches)."
    )
    files: int = Field(500, ge=1, description="Files held (inputs and outputs).")
    file_bytes: int = Field(
        20 * 1000**3, ge=1, description="Bytes of files held, and of the files pending Uploads will make (20 GB)."
    )
    open_uploads: int = Field(20, ge=1, description="Uploads pending (created, not completed, cancelled or expired).")
    upload_parts: int = Field(
        1_000, ge=1, description="Parts of one Upload (200 MB in the front's 4 MiB parts is 48; 8 GB in 8 MiB, 1,000)."
    )
    max_n: int = Field(8, ge=1, description="Choices one request may ask for (`n`).")
    max_tokens: int = Field(
        32_768,
        ge=1,
        description="Output tokens one request may ask for (`max_tokens`, `max_completion_tokens`, "
        "`max_output_tokens`).",
    )

    @classmethod
    def counts(cls) -> list[str]:
        """The fields that are counts (each a positive integer): every one but `priorities`."""
        return [name for name in cls.model_fields if name != PRIORITIES]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BatchApiQuotas:
        """The quotas set as LLM_BATCH_QUOTA_<FIELD> (LLM_BATCH_QUOTA_OPEN_BATCHES=20, ...,
        LLM_BATCH_QUOTA_PRIORITIES=team-a=10,nightly=-5); unset: the default. A value that is not a positive
        integer (or, for the priorities, not NAME=PRIORITY pairs) is a ValueError naming the setting."""
        given: dict[str, Any] = {}
        setting = ENV_PREFIX + PRIORITIES.upper()
        if env.get(setting, "").strip():
            given[PRIORITIES] = parse_priorities(env[setting], setting)
        for name in cls.counts():
            setting = ENV_PREFIX + name.upper()
            value = env.get(setting, "").strip()
            if not value:
                continue
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{setting} must be a positive integer, got {value!r}")
            given[name] = int(value)
        return cls(**given)

    def env(self) -> dict[str, str]:
        """The settings `from_env` reads: what the stack passes to the front (the priorities only when some are
        set: unset reads as none)."""
        settings = {ENV_PREFIX + name.upper(): str(getattr(self, name)) for name in type(self).counts()}
        if self.priorities:
            settings[ENV_PREFIX + PRIORITIES.upper()] = priorities_text(self.priorities)
        return settings
