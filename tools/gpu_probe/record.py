"""The probe's JSON, rewritten whole after every step: a run killed mid-way leaves a valid file with the steps it
finished and the one it was in (`running`)."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Record:
    def __init__(self, path: Path, head: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**head, "status": "running", "running": None, "steps": {}}
        self._write()

    def run(self, name: str, step: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """One step: its result, or its error, written at once; a failed step does not stop the ones after it
        (a GPU lent for 15 minutes should bring back everything that could be measured)."""
        self.data["running"] = name
        self._write()
        started = time.monotonic()
        try:
            result: dict[str, Any] | None = step()
            entry = dict(result or {})
        except Exception as error:  # the error is the step's result
            result = None
            entry = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(limit=4)}
        entry["seconds"] = round(time.monotonic() - started, 2)
        self.data["steps"][name] = entry
        self.data["running"] = None
        self._write()
        return result

    def finish(self) -> None:
        self.data["status"] = "done"
        self._write()

    def _write(self) -> None:
        # Write then rename: a kill during the write leaves the previous complete file, never half a one.
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(partial, self.path)
