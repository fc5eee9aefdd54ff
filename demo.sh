#!/usr/bin/env bash
# The main job on embedded defaults: installs into .venv, starts the embedded PostgreSQL and Bolt server,
# processes sample PDFs (text, scanned, broken) end to end and prints a summary.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
exec .venv/bin/docqueue demo "$@"
