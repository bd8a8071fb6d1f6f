"""Storage and formats: one file API over local paths and s3://, and the row formats the job reads and writes.

- `storage`: local and S3 files with the atomic write and move the commit protocol relies on;
- `rows`: the native input format, parsed and validated row by row (what the engine gets, what goes to errors);
- `results`: engine output shaped into result rows and error records.

May import: `contract` only; never Ray or vLLM (the validation stage runs these checks inside Ray tasks: it
imports them, not the other way round).
"""
