"""Plan checks: no long-lived credentials, whoever adds them.

- `iam-users`: no IAM user, access key, console password (login profile) or other per-user credential (SSH key,
  signing certificate, service-specific credential) of any type token that makes one. Everything the project
  runs assumes a role (EC2 instance profiles, IRSA, service principals); a user's keys never expire and leak.
- `secret-values`: nothing secret-shaped written into the plan (`infra.rules.secret_scan`: AWS keys, Hugging Face
  tokens, PEM private keys, by their shape in every input of every resource, base64 user data decoded) and no
  literal under a secret's name in the places a secret is most often pasted: Lambda environments, container
  and pod environments (every pod template of every Kubernetes object the plan declares, and the night's RayJob
  and ConfigMap rendered from the `rayjob_args` export; ECS container definitions), ConfigMaps (keys and the
  files they hold), Step Functions definitions, and EC2 user data. A secret reaches the job from Secrets
  Manager at run time, by its ARN (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import yaml

from infra.rules import secret_scan
from infra.rules.k8s_manifests import night_objects, pod_templates
from infra.rules.plan_view import SECRET_MASK, Plan, Rule, Violation, as_json, as_list, label, of_type, require_matches
from infra.rules.secret_scan import Finding

USER_TYPES: dict[str, str] = {
    "aws:iam/user:User": "an IAM user: a long-lived identity; use a role",
    "aws:iam/accessKey:AccessKey": "an access key: a credential that never expires; assume a role instead",
    "aws:iam/userLoginProfile:UserLoginProfile": "a console password for an IAM user; use SSO and roles",
    "aws:iam/serviceSpecificCredential:ServiceSpecificCredential": "a user's service-specific password",
    "aws:iam/signingCertificate:SigningCertificate": "a user's signing certificate",
    "aws:iam/sshKey:SshKey": "a user's SSH public key (CodeCommit)",
    "aws-native:iam:User": "an IAM user: a long-lived identity; use a role",
    "aws-native:iam:AccessKey": "an access key: a credential that never expires; assume a role instead",
}
ROLE_TYPES = ("aws:iam/role:Role", "aws-native:iam:Role")


def _user_problem(type_token: str) -> str | None:
    if type_token in USER_TYPES:
        return USER_TYPES[type_token]
    if type_token.startswith("aws:iam/user"):  # userPolicy, userGroupMembership, ...: a user must exist for them
        return "gives an IAM user something: no IAM user belongs in the stack"
    return None


def check_iam_users(plan: Plan) -> list[Violation]:
    name = "iam-users"
    violations: list[Violation] = []
    identities = 0
    for item in plan:
        if not item.get("custom"):
            continue
        problem = _user_problem(item["type"])
        identities += problem is not None or item["type"] in ROLE_TYPES
        if problem:
            violations.append(Violation(name, label(item), problem))
    require_matches(name, identities, "IAM role or user")
    return violations


# --- secret-shaped values -----------------------------------------------------------------------------------

CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
LAMBDA = "aws:lambda/function:Function"
STATE_MACHINE = "aws:sfn/stateMachine:StateMachine"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
ECS_TASK = "aws:ecs/taskDefinition:TaskDefinition"
CONFIG_MAP_KIND = "ConfigMap"
# Where a secret is most often pasted: the types whose inputs `secret-values` reads by name as well as by shape.
# Kubernetes objects are read wherever they carry a pod template or are a ConfigMap, whatever their kind.
LOCATION_TYPES = (LAMBDA, STATE_MACHINE, LAUNCH_TEMPLATE, INSTANCE, ECS_TASK)


def _masked(value: Any, where: str) -> list[Finding]:
    """A Pulumi secret (the plan's mask) anywhere in a value that is stored in clear."""
    return [
        Finding(path, "a Pulumi secret, stored in clear in the resource's configuration")
        for path, text in secret_scan.strings(value, where)
        if text == SECRET_MASK
    ]


def _lambda(inputs: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    variables = (inputs.get("environment") or {}).get("variables") or {}
    where = "inputs.environment.variables"
    return secret_scan.named_findings(variables, where, names) + _masked(variables, where)


def _state_machine(inputs: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    definition = as_json(inputs.get("definition"))
    return secret_scan.named_findings(definition, "inputs.definition", names) + _masked(definition, "inputs.definition")


def _user_data(inputs: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    findings: list[Finding] = []
    for key in ("userData", "userDataBase64"):
        value = inputs.get(key)
        if not isinstance(value, str) or not value:
            continue
        if value == SECRET_MASK:
            findings.append(Finding(f"inputs.{key}", "user data is a Pulumi secret: stored in clear on the instance"))
            continue
        # A launch template's userData is base64 (the provider's schema), an instance's plain text.
        text = secret_scan.decoded(value)
        findings += secret_scan.text_findings(value if text is None else text, f"inputs.{key}", names)
    return findings


def _ecs(inputs: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    findings: list[Finding] = []
    for index, container in enumerate(as_list(as_json(inputs.get("containerDefinitions")))):
        if isinstance(container, Mapping):
            where = f"inputs.containerDefinitions[{index}].environment"
            findings += secret_scan.env_findings(container.get("environment"), where, names)
            findings += _masked(container.get("environment"), where)
    return findings


READERS = {LAMBDA: _lambda, STATE_MACHINE: _state_machine, LAUNCH_TEMPLATE: _user_data, INSTANCE: _user_data}
READERS[ECS_TASK] = _ecs


def _pods(manifest: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    templates = list(pod_templates(manifest))
    if isinstance((manifest.get("spec") or {}).get("containers"), list):
        templates.append(("", dict(manifest)))  # a Pod: its own spec
    findings: list[Finding] = []
    for path, template in templates:
        spec = template.get("spec") or {}
        for kind in CONTAINER_LISTS:
            for index, container in enumerate(as_list(spec.get(kind))):
                where = f"{path + '.' if path else ''}spec.{kind}[{index}].env"
                findings += secret_scan.env_findings(container.get("env"), where, names)
                findings += _masked(container.get("env"), where)
    return findings


def _config_map(manifest: Mapping[str, Any], names: Collection[str]) -> list[Finding]:
    findings: list[Finding] = []
    for key, value in (manifest.get("data") or {}).items():
        where = f"data.{key}"
        named = secret_scan.is_secret_name(str(key)) and not secret_scan.is_reference(value, names)
        if value == SECRET_MASK or named:
            findings.append(Finding(where, secret_scan.literal_problem(value)))
        try:
            parsed = yaml.safe_load(str(value))
        except yaml.YAMLError:
            parsed = None
        if isinstance(parsed, dict | list):  # a config file: its keys, at any depth
            findings += secret_scan.named_findings(parsed, where, names)
        else:
            findings += secret_scan.text_findings(str(value), where, names)
    for key, value in (manifest.get("binaryData") or {}).items():
        text = secret_scan.decoded(str(value))
        if text is not None:
            findings += secret_scan.text_findings(text, f"binaryData.{key}", names)
    return findings


def _manifest(manifest: Mapping[str, Any], names: Collection[str]) -> tuple[bool, list[Finding]]:
    """(whether the object is a place `secret-values` reads by name, what it found there)."""
    pods = bool(list(pod_templates(manifest))) or isinstance((manifest.get("spec") or {}).get("containers"), list)
    config_map = manifest.get("kind") == CONFIG_MAP_KIND
    findings = (_pods(manifest, names) if pods else []) + (_config_map(manifest, names) if config_map else [])
    if not config_map:
        findings += secret_scan.shape_findings(dict(manifest), "manifest")
    return pods or config_map, findings


def secret_names(plan: Plan) -> set[str]:
    """The names of the plan's secrets and parameters: a value naming one is a reference, not the secret."""
    types = ("aws:secretsmanager/secret:Secret", "aws:ssm/parameter:Parameter")
    return {str(item["inputs"]["name"]) for item in of_type(plan, *types) if item["inputs"].get("name")}


def _night_manifests(plan: Plan) -> Iterator[tuple[str, Mapping[str, Any]]]:
    stacks = [item for item in plan if item["type"] == "pulumi:pulumi:Stack"]
    for manifest in night_objects(plan):
        metadata = manifest.get("metadata") or {}
        yield f"{label(stacks[0])} rayjob_args -> {manifest.get('kind')} {metadata.get('name')}", manifest


def check_secret_values(plan: Plan) -> list[Violation]:
    name = "secret-values"
    names = secret_names(plan)
    violations: list[Violation] = []
    places = 0

    def report(where: str, findings: list[Finding]) -> None:
        seen: set[Finding] = set()
        for finding in findings:
            if finding not in seen:
                seen.add(finding)
                violations.append(Violation(name, where, str(finding)))

    for item in plan:
        if not item.get("custom"):
            continue
        findings: list[Finding] = []
        reader = READERS.get(item["type"])
        if reader is not None:
            places += 1
            findings += reader(item["inputs"], names)
        if item["type"].startswith("kubernetes:"):
            counted, found = _manifest(item["inputs"], names)
            places += counted
            findings += found
        else:
            findings += secret_scan.shape_findings(item["inputs"], "inputs")
        report(label(item), findings)
    for where, manifest in _night_manifests(plan):
        counted, found = _manifest(manifest, names)
        places += counted
        report(where, found)
    require_matches(name, places, "Lambda function, pod template, ConfigMap, state machine or user data")
    return violations


RULES: dict[str, Rule] = {
    "iam-users": Rule(
        check_iam_users, "remove the user and its credentials: give what needs AWS a role (instance profile, IRSA)"
    ),
    "secret-values": Rule(
        check_secret_values,
        "put the secret in Secrets Manager (its value set outside the plan) and pass its ARN; the code reads it at "
        "run time (the hub token: infra/components/secrets.py)",
    ),
}
