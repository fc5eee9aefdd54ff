"""The layering contracts: the floors orchestration -> resources -> processing -> queue_db (a module imports only
from its own floor or lower ones, function-local imports included); queue_db never imports dagster; processing is
pure (no dagster, adapters or database drivers). Checked by import-linter with the contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    result = subprocess.run([lint, str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout, result.stdout
