"""The image's build context and content tag: Docker's .dockerignore rules, and a tag that moves exactly when
something the image copies moves."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from infra import versions
from infra.build_context import content_tag, context_files, is_ignored, parse_dockerignore

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "workload" / "Dockerfile"
ARGS = {"BASE_IMAGE": versions.WORKLOAD_BASE_IMAGE}
PLATFORM = "linux/amd64"


@pytest.mark.parametrize(
    ("rules", "path", "ignored"),
    [
        ("*.md", "README.md", True),
        ("*.md", "docs/guide.md", False),  # `*` never crosses a folder
        ("**/*.md", "docs/deep/guide.md", True),
        ("**/*.md", "guide.md", True),  # `**/` also matches no folder at all
        ("docs", "docs/deep/guide.md", True),  # excluding a folder excludes what is inside it
        ("/docs/", "docs/a.txt", True),  # leading and trailing slashes are cleaned
        ("*\n!keep.txt", "keep.txt", False),  # a later `!` rule puts a file back
        ("*\n!src/\nsrc/**/*.pyc", "src/pkg/mod.pyc", True),  # and a later rule takes it out again
        ("*\n!src/", "src/pkg/mod.py", False),
        ("*\n!requirements/gpu.txt", "requirements/cpu.txt", True),
        ("**/*.py[cod]", "a/b.pyc", True),
        ("**/*.py[!c]", "a/b.pyc", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("a/../b", "b/x", True),  # patterns are path-normalised
    ],
)
def test_dockerignore_rules_follow_docker(rules: str, path: str, ignored: bool) -> None:
    assert is_ignored(path, parse_dockerignore(rules)) is ignored


@pytest.mark.parametrize(("line", "message"), [("[abc", "unclosed"), ("!/", "names no path")])
def test_bad_dockerignore_lines_are_refused_with_the_line(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_dockerignore(line)


def test_repo_context_is_the_job_package_and_its_pins_only() -> None:
    files = context_files(REPO_ROOT)
    package = sorted(
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "workload").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo", ".pyd"}
    )
    # Both locks: the REQUIREMENTS build argument picks the one installed (the GPU one unless told otherwise).
    assert files == sorted(["pyproject.toml", "requirements/gpu.lock", "requirements/cpu.lock", *package])
    assert "workload/Dockerfile" in files and "requirements/dev.lock" not in files
    assert "requirements/cpu.txt" not in files  # the lock's source, like gpu.txt


def _tree(root: Path) -> Path:
    for relative in (
        "pyproject.toml",
        "requirements/gpu.lock",
        "requirements/cpu.lock",
        "requirements/gpu.txt",
        "requirements/cpu.txt",
        ".dockerignore",
        "README.md",
    ):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / relative, root / relative)
    shutil.copytree(REPO_ROOT / "workload", root / "workload", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_content_tag_moves_exactly_when_the_image_inputs_move(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    dockerfile = root / "workload" / "Dockerfile"
    first = content_tag(root, dockerfile, ARGS, PLATFORM)
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", first), "not a valid Docker tag"
    assert first == content_tag(root, dockerfile, dict(ARGS), PLATFORM), "same inputs, same tag"

    # What the image does not receive cannot change its tag: ignored files and bytecode.
    (root / "README.md").write_text("changed")
    (root / "requirements" / "cpu.txt").write_text("changed")
    (root / "requirements" / "gpu.txt").write_text("changed")  # the image installs the lock, not the wish list
    (root / "workload" / "__pycache__").mkdir()
    (root / "workload" / "__pycache__" / "config.cpython-311.pyc").write_bytes(b"\0")
    (root / "workload" / "weights.safetensors").write_bytes(b"\0")
    assert content_tag(root, dockerfile, ARGS, PLATFORM) == first

    # Everything it does receive, or is built with, does.
    changed = {content_tag(root, dockerfile, {"BASE_IMAGE": "python:3.11.15-slim-bookworm"}, PLATFORM)}
    changed.add(content_tag(root, dockerfile, ARGS, "linux/arm64"))
    job_config = root / "workload" / "contract" / "config.py"
    job_config.write_text(job_config.read_text() + "\n")
    changed.add(content_tag(root, dockerfile, ARGS, PLATFORM))
    (root / "requirements" / "gpu.lock").write_text((root / "requirements" / "gpu.lock").read_text() + "\n")
    changed.add(content_tag(root, dockerfile, ARGS, PLATFORM))
    # The CPU build (`make image`) is a build argument away, so its tag is another one.
    changed.add(content_tag(root, dockerfile, {**ARGS, "REQUIREMENTS": "requirements/cpu.lock"}, PLATFORM))
    (root / "workload" / "new_module.py").write_text("")
    changed.add(content_tag(root, dockerfile, ARGS, PLATFORM))
    # docker-build's own context hash covers permission bits, so the tag must move with them too.
    (root / "workload" / "new_module.py").chmod(0o755)
    changed.add(content_tag(root, dockerfile, ARGS, PLATFORM))
    assert first not in changed and len(changed) == 7


def test_a_dockerfile_specific_ignore_file_takes_precedence(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    dockerfile = root / "workload" / "Dockerfile"
    assert "README.md" not in context_files(root, dockerfile)
    (root / "workload" / "Dockerfile.dockerignore").write_text("*\n!README.md\n")
    assert context_files(root, dockerfile) == ["README.md"]
    assert context_files(root) != ["README.md"]  # without the Dockerfile, the context's own file applies


def test_content_tag_is_the_same_from_any_checkout_path(tmp_path: Path) -> None:
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "elsewhere" / "two")
    assert content_tag(one, one / "workload" / "Dockerfile", ARGS, PLATFORM) == content_tag(
        two, two / "workload" / "Dockerfile", ARGS, PLATFORM
    )
