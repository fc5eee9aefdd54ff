"""`docqueue` as a user starts it, in a process of its own, for the tests that drive the CLI (the environment is the
test's: its databases, home and stores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def docqueue(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m orchestration.cli ARGS` from the checkout; `env` adds to (or overrides) the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def probe(script: str, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c SCRIPT ARGS` from the checkout in a fresh interpreter whose environment is `env` alone (plus the
    checkout on PYTHONPATH and a plain PATH): what a command loads, undisturbed by the test's own imports."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", **env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
