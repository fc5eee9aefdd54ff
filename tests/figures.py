"""Figures a test prints for the closing notes, shown past pytest's output capture.

In a single process they print at once. Under pytest-xdist a worker's output never reaches the terminal, so each
worker appends them to a file the controlling process names, and the controller prints them all in the summary
(`pytest_terminal_summary` in tests/conftest.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

FILE_KEY = "docqueue_figures_file"


def announce(request, text: str) -> None:
    """Show `text` (one or more lines) whatever the capture and however many processes run the suite."""
    shared = getattr(request.config, "workerinput", {}).get(FILE_KEY)
    if shared:
        with open(shared, "a") as handle:
            # one locked write per call: the two workers' tables never interleave
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(text.rstrip("\n") + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(text, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print(text, flush=True)


def collected(path: Path) -> str:
    return path.read_text() if path.exists() else ""
