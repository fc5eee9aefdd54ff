#!/usr/bin/env bash
# The test suite: installs into .venv (with the test extras) and runs every test against real services
# (an embedded PostgreSQL and Bolt server the tests start themselves).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh test
# the browser test drives Debian's Chromium; without it that one test skips and says so
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test.sh: could not install chromium; the browser test will be skipped" >&2
fi
# the clock-skew test runs workers under Debian's libfaketime; without it that one test skips and says so
if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null && [ "$(id -u)" = "0" ] \
  && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null) \
    || echo "test.sh: could not install libfaketime; the clock-skew test will be skipped" >&2
fi
# the house's habits first: lint with the complexity limit, the layout, and the types of queue_db and processing
.venv/bin/ruff check --no-cache .
.venv/bin/ruff format --check --no-cache .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
