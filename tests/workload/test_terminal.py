"""The run's terminal routing without Ray: which writes reach the person, which only the log file."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from workload.telemetry import terminal
from workload.telemetry.progress import Progress


class _Screen(io.StringIO):
    def isatty(self) -> bool:
        return True


def _router() -> tuple[terminal._Router, io.StringIO, io.StringIO]:
    screen, log = io.StringIO(), io.StringIO()
    return terminal._Router(terminal._Terminal(screen), log, 2), screen, log


def test_product_lines_reach_the_terminal_and_everything_the_log() -> None:
    router, screen, log = _router()
    print("2026-12-01 INFO worker.py:2038 -- Started a local Ray instance.", file=router)
    print("[llm-batch] the engine died and was rebuilt 1 time(s)", file=router)
    print("\nllm-batch: 3/4 rows answered\n  tokens: 1 in, 2 out", file=router)
    router.write("WARNING vllm: partial ")
    router.write("line\n")
    assert screen.getvalue() == "[llm-batch] the engine died and was rebuilt 1 time(s)\n" + (
        "\nllm-batch: 3/4 rows answered\n  tokens: 1 in, 2 out\n"
    )
    assert "Started a local Ray instance" in log.getvalue() and "partial line" in log.getvalue()
    assert "llm-batch: 3/4 rows answered" in log.getvalue()


def test_not_a_tty_or_verbose_keeps_the_plain_lines() -> None:
    assert not terminal.wants_display(verbose=False, stderr=io.StringIO())
    assert not terminal.wants_display(verbose=True, stderr=_Screen())
    assert terminal.wants_display(verbose=False, stderr=_Screen())


def test_without_a_terminal_the_progress_is_a_plain_line(capsys: object) -> None:
    progress = Progress(total=4, already=0, attempt=1)
    progress.advance(3, 1, 10)
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert err.startswith("[llm-batch] attempt 1: 4/4 rows (100%), 1 failed")


def test_a_child_process_writes_to_the_log_not_the_terminal(tmp_path: Path) -> None:
    """At a pseudo-terminal: a C-level write of a child (as Ray's and vLLM's processes make) lands in the log."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from pathlib import Path
        from workload.telemetry.terminal import run_display
        with run_display(verbose=False, log_dir=Path({str(tmp_path)!r})) as path:
            subprocess.run(["sh", "-c", "echo raylet noise >&2; echo engine noise"])
            print("[llm-batch] attempt 1: resuming", file=sys.stderr)
            print("ray driver noise")
        print("after", path is not None)
        """
    )
    import pty

    controller, child = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.run(
        [sys.executable, "-c", script], stdin=child, stdout=child, stderr=child, env=env, timeout=60
    )
    os.close(child)
    screen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    text = screen.decode()
    assert process.returncode == 0, text
    (log,) = tmp_path.glob("run-*.log")
    assert "raylet noise" in log.read_text() and "engine noise" in log.read_text()
    assert "ray driver noise" in log.read_text()
    assert "noise" not in text
    assert "[llm-batch] attempt 1: resuming" in text and "after True" in text
    assert f"Ray's and vLLM's logs: {log}" in text
