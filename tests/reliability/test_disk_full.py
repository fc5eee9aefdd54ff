"""Fault-matrix row 5, a full disk: the storage folder, then the embedded Qdrant folder, is a small file system of its
own (tmpfs) that fills up while real PDFs are processed. The writes that meet it fail retryably with one sentence
naming the folder, nothing is half-written, and once the space is freed the retries complete every document: no
point, node or edge twice, no temporary file left, and `docqueue verify` clean (bench/faults.py row 5 measures it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import pdf_factory as pf
from tests.reliability.support import REPO_ROOT, QueueWatcher, Stores, document_statuses, figures_line, store_figures

ALL_COMPLETED = ("completed", "completed", "completed")
FAILED_ATTEMPTS_BEFORE_FREEING = 2
RETRY_SETTINGS = {"MAX_TASK_RETRIES": "6", "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2", "DOCQUEUE_RETRY_BACKOFF_MAX": "1"}


class SmallDisk:
    """A tmpfs of `size_mib` mounted on `folder`, filled by a file of its own and freed by deleting that file."""

    def __init__(self, folder: Path, size_mib: int):
        if os.geteuid() != 0:
            pytest.skip("mounting a small file system (tmpfs) needs root, and these tests do not run as root")
        folder.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(folder)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip() or mounted.returncode}")
        self.folder = folder
        self.filler = folder / "filler.bin"

    def fill(self, leave_bytes: int = 0) -> None:
        """Take every free byte but `leave_bytes`."""
        left = shutil.disk_usage(self.folder).free - leave_bytes
        with open(self.filler, "ab") as handle:
            block = b"\0" * (1 << 20)
            while left > 0:
                try:
                    handle.write(block[: min(left, len(block))])
                    handle.flush()
                except OSError:  # the file system is full already
                    break
                left -= min(left, len(block))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.folder)], check=False, capture_output=True)


class _Watcher(QueueWatcher):
    """Watches the queue while the pipeline runs: records the errors of `phase`, and frees the disk once the
    tasks meeting it have failed twice."""

    def __init__(self, queue, table: str, phase: str, disk: SmallDisk):
        self.queue, self.table, self.phase, self.disk = queue, table, phase, disk
        self.errors: set[str] = set()
        self.freed_at: float | None = None
        self.failed_tasks: set[str] = set()
        super().__init__()

    def _look(self) -> None:
        p = self.phase
        with self.queue.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id::text, {p}_retry_count, {p}_error_class || ': ' || {p}_error FROM {self.table} "
                f"WHERE {p}_status = 'failed'"
            ).all()
        self.errors |= {r[2] for r in rows}
        self.failed_tasks |= {r[0] for r in rows}
        if self.freed_at is None and any(r[1] >= FAILED_ATTEMPTS_BEFORE_FREEING for r in rows):
            self.disk.free()
            self.freed_at = time.monotonic()


def _docqueue_verify() -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", "verify", "--json"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


def _documents(tmp_path: Path) -> list[Path]:
    topics = list(pf.TWO_TOPICS.values())
    return [
        pf.text_pdf(tmp_path, f"report-{i}.pdf", [topics[i % 2], topics[(i + 1) % 2], pf.DEMO_PAGE]) for i in (0, 1)
    ]


def _finish(pipeline, watcher: _Watcher, folder: Path) -> dict:
    queue = pipeline.queue
    assert set(document_statuses(queue).values()) == {ALL_COMPLETED}, (
        document_statuses(queue),
        watcher.errors,
        watcher.problems,
    )
    expected = f"disk_full: disk full: no space left in {folder}"
    assert watcher.errors and all(e.startswith(expected) for e in watcher.errors), (expected, watcher.errors)
    # one sentence each: no traceback, no second line
    assert all("\n" not in e and "Traceback" not in e and e.count(". ") == 0 for e in watcher.errors), watcher.errors
    assert watcher.freed_at is not None and not watcher.problems, watcher.problems
    stores = Stores.open()
    try:
        figures = store_figures(queue, stores)
        stored_ids = stores.vector.chunk_ids()
    finally:
        stores.close()
    assert figures["points"] == figures["chunks"] == len(stored_ids), figures  # one point per chunk id
    assert set(figures["duplicates"].values()) == {0}, figures["duplicates"]
    assert figures["verify"]["consistent"], figures["verify"]
    report = _docqueue_verify()
    assert report["consistent"], report
    return {
        "faults": 1,
        "tasks_lost": 0,
        "duplicates": sum(figures["duplicates"].values()),
        "failed_tasks": len(watcher.failed_tasks),
        "full_s": round(watcher.freed_at - watcher.started, 1),
        "chunks": figures["chunks"],
    }


def test_a_full_storage_folder_fails_pages_retryably_until_space_is_freed(pipeline, tmp_path, monkeypatch, say):
    for name, value in RETRY_SETTINGS.items():
        monkeypatch.setenv(name, value)
    pipeline.reload_settings()
    folder = pipeline.storage.root
    disk = SmallDisk(folder, size_mib=2)
    try:
        pipeline.ingest(_documents(tmp_path))  # the PDFs are kept in the storage folder too
        disk.fill(leave_bytes=2 * 4096)  # room for two pages' markdown: the third page meets a full disk
        with _Watcher(pipeline.queue, "task_queue_page", "ocr", disk) as watcher:
            report = pipeline.run_until_idle(max_seconds=120)
        leftovers = [p for p in folder.rglob("*") if p.name.startswith(".tmp-")]
        assert leftovers == [], leftovers  # nothing half-written
        pages = list(folder.rglob("page_*_nohf.md"))
        assert len(pages) == 6 and all(p.stat().st_size > 0 for p in pages), pages
        figures = _finish(pipeline, watcher, folder)
    finally:
        disk.unmount()
    say(figures_line("disk full: storage folder", {**figures, "runs": report.runs}))


def test_a_full_embedded_store_folder_fails_vectors_retryably_until_space_is_freed(
    pipeline, rel_env, tmp_path, monkeypatch, say
):
    from resources.folder_room import WRITE_HEADROOM_BYTES

    for name, value in RETRY_SETTINGS.items():
        monkeypatch.setenv(name, value)
    pipeline.reload_settings()
    folder = rel_env.home / "qdrant"
    # the store refuses a write with less than WRITE_HEADROOM_BYTES free (its engine would die of SIGBUS without)
    disk = SmallDisk(folder, size_mib=(WRITE_HEADROOM_BYTES >> 20) + 16)
    try:
        pipeline.ingest(_documents(tmp_path))
        disk.fill(leave_bytes=1 << 20)  # full before the first vector is written; OCR and chunking go on
        with _Watcher(pipeline.queue, "task_queue_chunk", "vector", disk) as watcher:
            report = pipeline.run_until_idle(max_seconds=120)
        assert not [p for p in folder.rglob("*.tmp")], "a half-written count file is left"
        figures = _finish(pipeline, watcher, folder)
    finally:
        from resources.folder_lock import release_lingering

        release_lingering()  # the shard lingers open; closed before its file system goes
        disk.unmount()
    say(figures_line("disk full: embedded store folder", {**figures, "runs": report.runs}))
