"""What the job and the endpoint report: metrics, CloudWatch, log shipping, GPU and serve reporters, start-up marks
and the terminal's progress display.

May import: `contract` only (and the standard library, boto3, nvidia-ml-py): telemetry observes the job, it never
drives it.
"""
