"""What one key of the Batch API may hold, and how large a request may ask (issue 60): the quotas the stack's
config sets (`llm-batch:batch_api.quotas`), the front reads from its environment and the local server from flags.

One model for the three, so the stack's config, the function's settings and the service agree on every name.
The service's checks are in workload/batch_api/quotas.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "LLM_BATCH_QUOTA_"


class BatchApiQuotas(BaseModel):
    """Per key (per owner: the key's tenant in key scope, the project in project scope); defaults for a team
    sharing one GPU queue. Every value at least 1."""

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
    def from_env(cls, env: Mapping[str, str]) -> BatchApiQuotas:
        """The quotas set as LLM_BATCH_QUOTA_<FIELD> (LLM_BATCH_QUOTA_OPEN_BATCHES=20, ...); unset: the default.
        A value that is not a positive integer is a ValueError naming the setting."""
        given: dict[str, int] = {}
        for name in cls.model_fields:
            setting = ENV_PREFIX + name.upper()
            value = env.get(setting, "").strip()
            if not value:
                continue
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{setting} must be a positive integer, got {value!r}")
            given[name] = int(value)
        return cls(**given)

    def env(self) -> dict[str, str]:
        """The settings `from_env` reads: what the stack passes to the front."""
        return {ENV_PREFIX + name.upper(): str(getattr(self, name)) for name in type(self).model_fields}
