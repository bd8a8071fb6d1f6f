"""What `infra.rules.secret_scan` takes for a secret and what it leaves alone: the project's own references
(ARNs, token files, IMDS session tokens, token counts) must never read as secrets, or the gate would cry wolf."""

from __future__ import annotations

import base64
import gzip

import pytest

from infra.rules import secret_scan

SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documentation example


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("HF_TOKEN", True),
        ("hubToken", True),
        ("db-password", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("privateKey", True),
        ("X-aws-ec2-metadata-token-ttl-seconds", True),  # named like one; its value (a number) is no secret
        ("max_tokens", False),  # a count
        ("max_num_batched_tokens", False),
        ("tokenizer", False),  # a model part
        ("THRESHOLD_USD", False),
        ("SecretsManagerArnSuffix", True),
    ],
)
def test_secret_names_are_read_by_word(key: str, secret: bool) -> None:
    assert secret_scan.is_secret_name(key) is secret


@pytest.mark.parametrize(
    "value",
    [
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:llm-batch-small/hub-token-19e570",
        "/var/run/llm-batch/secrets/hub_token",
        "$(curl -sf -X PUT http://169.254.169.254/latest/api/token)",
        "${IMDS_TOKEN}",
        "https://sts.us-east-1.amazonaws.com/",
        "{{resolve:secretsmanager:llm-batch/hub-token}}",
        300,
        None,
        "",
        "llm-batch-small/hub-token",  # a secret of the plan, by name
    ],
)
def test_references_are_not_secrets(value: object) -> None:
    assert secret_scan.is_reference(value, {"llm-batch-small/hub-token"})


@pytest.mark.parametrize("value", ["hunter2", "[secret]", "https://ml:pw@example.com/", "sk-live-1234"])
def test_literals_are_not_references(value: str) -> None:
    assert not secret_scan.is_reference(value)


def test_shapes_are_found_and_never_repeated() -> None:
    text = f"key=AKIAIOSFODNN7EXAMPLE secret={SECRET_ACCESS_KEY} hub=hf_{'a1B2' * 9}\n-----BEGIN PRIVATE KEY-----"
    assert secret_scan.shapes_in(text) == [
        "an AWS access key id",
        "an AWS secret access key",
        "a Hugging Face token",
        "a PEM private key",
    ]
    assert all(SECRET_ACCESS_KEY not in str(finding) for finding in secret_scan.shape_findings({"k": text}, "in"))


@pytest.mark.parametrize(
    "text",
    [
        "a" * 40,  # no digits, one case
        "d0ce288b4a259eb407f64a7f0123456789abcdef",  # a hex digest: lower case only
        "/etc/llm-batch/secrets/Hub1token/abcdefgh",  # a path
        "bW9jayBDQSBvZiBsbG0tYmF0Y2gtbGFyZ2U=bW9jayBDQSBvZiBsbG0tYmF0Y2gtbGFyZ2U=",  # base64 longer than a key
        "ASIA-not-a-key AKIA123",
    ],
)
def test_look_alikes_are_not_secrets(text: str) -> None:
    assert secret_scan.shapes_in(text) == []


def test_scripts_are_read_for_assignments() -> None:
    script = 'IMDS_TOKEN=$(curl -sf)\nexport HF_TOKEN_PATH=/var/run/t\nDB_PASSWORD="s3cr3t" ./run\n'
    assert [str(f) for f in secret_scan.text_findings(script, "userData")] == [
        "userData (DB_PASSWORD): a literal under a secret's name (only a reference belongs there: an ARN, a file "
        "path, a variable)"
    ]


def test_gzipped_user_data_is_read() -> None:
    encoded = base64.b64encode(gzip.compress(b"#!/bin/bash\necho hi\n")).decode()
    assert secret_scan.decoded(encoded) == "#!/bin/bash\necho hi\n"
    assert secret_scan.decoded("#!/bin/bash not base64") is None


def test_step_functions_paths_are_not_literals() -> None:
    definition = {"Parameters": {"SecretId.$": "$.secret", "SecretId": "arn:aws:secretsmanager:x", "Token": "abc"}}
    assert [f.where for f in secret_scan.named_findings(definition, "def")] == ["def.Parameters.Token"]
