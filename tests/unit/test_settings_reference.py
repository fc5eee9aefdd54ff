"""docs/configuration.md documents exactly the settings that exist, with their defaults: its settings tables are the
ones `python -m queue_db.config_reference` renders, and every variable the README or any page of docs/ names is a
setting (or one of the test-suite and benchmark switches listed here, which the application never reads)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from queue_db import config_reference
from queue_db.config import ALL_GROUPS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
CONFIGURATION = REFERENCE.read_text(encoding="utf-8")
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS = {name for group in ALL_GROUPS for name in group.variables()}
# switches of the test suite, the benchmarks and the install scripts, listed at the end of docs/configuration.md
NOT_SETTINGS = {
    "DOCQUEUE_CORPUS",
    "DOCQUEUE_SCALE_TESTS",
    "DOCQUEUE_TEST_NEO4J_URI",
    "DOCQUEUE_TEST_PG_ADMIN_URL",
    "DOCQUEUE_TEST_OWN_PG_URL",
    "DOCQUEUE_TEST_CHROMIUM",
    "DOCQUEUE_BENCH_PG_ADMIN_URL",
    "DOCQUEUE_PYTHON",
}
VARIABLE = re.compile(
    r"\b(?:DOCQUEUE_[A-Z0-9_]*[A-Z0-9]|TASK_QUEUE_[A-Z_]+|WORKER_POLL_INTERVAL|HEARTBEAT_INTERVAL|"
    r"STALE_TASK_TIMEOUT|MAX_TASK_RETRIES)\b"
)


def test_the_generator_writes_docs_configuration():
    assert config_reference.REFERENCE == REFERENCE


def test_the_configuration_tables_are_the_rendered_settings():
    assert config_reference.documented_block(CONFIGURATION) == config_reference.render(), (
        "docs/configuration.md's settings tables are stale: run `python -m queue_db.config_reference`"
    )


def test_every_setting_has_a_row_with_its_default():
    block = config_reference.documented_block(CONFIGURATION)
    for group in ALL_GROUPS:
        for info in group.model_fields.values():
            assert f"| `{info.alias}` | {config_reference.shown_default(info)} |" in block, info.alias
            assert info.description, f"{info.alias} has no meaning to document"


def test_every_variable_the_documents_name_exists():
    assert len(DOCUMENTS) >= 2, "README.md and the pages of docs/"
    for document in DOCUMENTS:
        named = set(VARIABLE.findall(document.read_text(encoding="utf-8")))
        assert named - SETTINGS - NOT_SETTINGS == set(), document.relative_to(ROOT)


def test_the_switches_that_are_not_settings_are_never_read_by_the_application():
    for name in NOT_SETTINGS:
        for package in ("queue_db", "resources", "orchestration", "processing"):
            for path in (ROOT / package).rglob("*.py"):
                assert name not in path.read_text(encoding="utf-8"), f"{path} reads {name}: make it a setting"


def test_the_generator_reports_a_stale_document(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(
        CONFIGURATION.replace("| `DOCQUEUE_OCR_DPI` | 200 |", "| `DOCQUEUE_OCR_DPI` | 300 |"), encoding="utf-8"
    )
    check = [sys.executable, "-m", "queue_db.config_reference", "--file", str(stale)]
    proc = subprocess.run([*check, "--check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and "differ" in proc.stderr
    assert subprocess.run(check, cwd=ROOT).returncode == 0  # rewrites the block
    assert stale.read_text(encoding="utf-8") == CONFIGURATION


def test_a_document_without_the_markers_is_refused(tmp_path):
    bare = tmp_path / "configuration.md"
    bare.write_text("# Configuration\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "queue_db.config_reference", "--file", str(bare), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 1 and "markers are missing" in proc.stderr
