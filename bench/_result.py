"""The line every bench ends with: `RESULT {json}`, its figures plus the commit of the checkout that measured them.

Not a bench of its own: the scripts of bench/ import it (tests/acceptance/test_bench_smoke.py leaves out the modules
whose names start with an underscore)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        # no optional locks: `git status` may run while another git command holds the index
        done = subprocess.run(
            ["git", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str | None:
    """The checkout's commit (a short hash), with `-dirty` when tracked files differ from it: figures measured on
    uncommitted code say so. None outside a git checkout."""
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("-dirty" if changed else "")


def print_result(figures: dict, **dumps) -> None:
    """Print the bench's last line; `dumps` are json.dumps options (sort_keys, separators)."""
    print("RESULT " + json.dumps({**figures, "commit": commit()}, **dumps), flush=True)
