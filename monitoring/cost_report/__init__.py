"""The daily cost-report Lambda. Its source is its own package: it imports only boto3 and the stdlib."""
