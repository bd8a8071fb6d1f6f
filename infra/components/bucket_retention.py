"""How long the data bucket keeps what the Batch API and the queue delete (issue 61): its lifecycle rules beside
the job's archive rules (infra/components/storage.py builds them all into one configuration).

The bucket is versioned, so a `DeleteObject` (the API deleting a file, the tick deleting an output folder or a
record past its retention) only hides the object behind a delete marker, and every compare-and-swap write of a
record leaves the record's previous version behind. Without these rules both stay, and bill, forever.

- `batch-api/` (the API's store: records, files, upload parts, the batches' job output, the executor's markers;
  and whatever key it adds later, as the rule is the whole prefix) and `control/` (the small tier's run request,
  rewritten every night and every batch): a version that stopped being current goes after
  `DELETED_KEPT_DAYS`, and a delete marker left with no version behind it goes too.
- The bodies the API keeps for its retention (docs/batch-api.md, "Limits and retention": 30 days, OpenAI's for
  batch files): the tick deletes them when that time is up; these rules delete what a stopped queue left, the
  uploaded and output files `BODY_BACKSTOP_DAYS` after they were written and an Upload's parts a day after
  (an Upload expires after an hour). Records get no such rule: a file or batch record can rightly be older than
  any bound (an input file outlives its `expires_at` while its batch runs; the GPU slot record stays unchanged).
- Incomplete multipart uploads (a function killed mid-body at its timeout cannot abort its own) are aborted by
  the bucket's one rule over every prefix, `ABORT_UPLOADS_DAYS` after they began.

AWS's rules these follow (the S3 API reference's LifecycleExpiration and NoncurrentVersionExpiration, and the
user guide's "How Amazon S3 handles conflicts in lifecycle configurations", read 2026-12-07): one Expiration may
not hold both `ExpiredObjectDeleteMarker` and `Days` (so the marker rule and the body backstops are separate
rules); `Days` and `NoncurrentDays` are positive integers, so 1 is the shortest; a rule with `Days` also removes
delete markers once they are that old; rules whose prefixes overlap are allowed, and where two expirations
overlap the shorter one is honoured; S3 counts days from the object's creation, rounded up to the next midnight UTC.
"""

from __future__ import annotations

import pulumi_aws as aws
from pulumi_aws.s3 import BucketLifecycleConfigurationRuleArgs as Rule

from infra.components.batch_api import API_PREFIX
from infra.components.nightly_roles import RUN_REQUEST_KEY

#: What the Batch API keeps its files and its batches' job output for (workload/batch_api/objects.py
#: DEFAULT_RETENTION_S, which the AWS front runs with; tests/infra/test_bucket_retention.py holds them equal).
RETENTION_DAYS = 30
#: A deleted or overwritten version of the API's and the queue's keys is kept this long: AWS's shortest. The API
#: has no undelete, so an old version serves only an operator restoring by hand within the day.
DELETED_KEPT_DAYS = 1
#: The retention, plus the 24-hour completion window through which an input outlives its `expires_at` and an
#: output is written before its batch finishes, plus a day for a slow tick: the tick always deletes first.
BODY_BACKSTOP_DAYS = RETENTION_DAYS + 3
#: An Upload expires an hour after it is made and its parts go with it; a day is S3's shortest.
UPLOAD_PARTS_DAYS = 1
ABORT_UPLOADS_DAYS = 7

CONTROL_PREFIX = RUN_REQUEST_KEY.split("/", 1)[0] + "/"
#: Every prefix the Batch API and the queue write in the data bucket.
WRITTEN_PREFIXES = (API_PREFIX, CONTROL_PREFIX)
#: Where the API's bodies lie under its prefix (workload/batch_api/files.py body_key, uploads.py, service.py's
#: `batches/<id>/output`), with the days after which a body still there is deleted.
BODY_PREFIXES = {
    f"{API_PREFIX}files/": BODY_BACKSTOP_DAYS,
    f"{API_PREFIX}batches/": BODY_BACKSTOP_DAYS,
    f"{API_PREFIX}uploads/": UPLOAD_PARTS_DAYS,
}


def _rule_id(prefix: str) -> str:
    return prefix.strip("/").replace("/", "-") or "all"


def _filter(prefix: str) -> aws.s3.BucketLifecycleConfigurationRuleFilterArgs:
    return aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=prefix)


def deleted_data_rules() -> list[Rule]:
    """For each written prefix: old versions after `DELETED_KEPT_DAYS`, then the delete markers they leave."""
    return [
        Rule(
            id=f"deleted-{_rule_id(prefix)}",
            status="Enabled",
            filter=_filter(prefix),
            noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=DELETED_KEPT_DAYS
            ),
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(expired_object_delete_marker=True),
        )
        for prefix in WRITTEN_PREFIXES
    ]


def body_backstop_rules() -> list[Rule]:
    """The API's bodies past their retention, when no tick deleted them (a rule of their own: `Days`)."""
    return [
        Rule(
            id=f"retention-{_rule_id(prefix)}",
            status="Enabled",
            filter=_filter(prefix),
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=days),
        )
        for prefix, days in BODY_PREFIXES.items()
    ]


def abort_uploads_rule() -> Rule:
    """Every prefix's incomplete multipart uploads: the job's writes and the API's bodies alike."""
    return Rule(
        id="abort-incomplete-uploads",
        status="Enabled",
        filter=_filter(""),
        abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
            days_after_initiation=ABORT_UPLOADS_DAYS
        ),
    )


def retention_rules() -> list[Rule]:
    """The rules this module owns, in the order the configuration lists them."""
    return [*deleted_data_rules(), *body_backstop_rules(), abort_uploads_rule()]
