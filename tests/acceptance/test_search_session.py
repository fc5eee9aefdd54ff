"""The warm search session (resources/search_session.py) on real parts: the real model, the embedded vector store,
a real queue. Its results are `docqueue search --json`'s, and it keeps answering while a run writes to the store it
holds open, without keeping the run from finishing. `docqueue search` ends with the store open, so what it read stays
in the page cache for the next search."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queue_db.config import Settings
from resources.search_session import SearchSession
from tests.cli_runner import docqueue as run_docqueue

RUN_TIMEOUT_S = 600
TOPICS = {
    "bees": "Honey bees pollinate the clover in the meadow while the beekeeper counts the hives at dawn.",
    "volcano": "The volcano erupted at night and the lava flowed past the observatory, covering the road in ash.",
    "harbour": "Storm waves broke over the harbour wall and three fishing boats were torn from their moorings.",
}
LATER = {
    "glacier": "The glacier retreated forty metres in one summer, and meltwater flooded the valley below it.",
    "orchard": "Apple trees in the orchard were pruned in February and grafted with an older local variety.",
}


def docqueue(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return run_docqueue(*args, timeout=timeout, env={"COLUMNS": "200"})


def write_documents(folder: Path, topics: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    for name, sentence in topics.items():
        paragraphs = [f"{sentence} Note {n} on the {name} adds a detail of its own." for n in range(6)]
        (folder / f"{name}.md").write_text(f"# {name.title()}\n\n" + "\n\n".join(paragraphs) + "\n")
    return folder


def ingested_and_run(folder: Path) -> None:
    ingest = docqueue("ingest", str(folder), "--json")
    assert ingest.returncode == 0, ingest.stderr
    run = docqueue("run", "--until-idle", "--json")
    assert run.returncode == 0, run.stderr


@pytest.fixture
def processed(docqueue_env, tmp_path):
    ingested_and_run(write_documents(tmp_path / "first", TOPICS))
    return docqueue_env


def test_a_session_returns_what_docqueue_search_prints(processed):
    queries = ["bees pollinate clover", "lava and ash at night", "boats torn from moorings", "detail"]
    with SearchSession(Settings.from_env()) as session:
        for query in queries:
            for flags, mode in (([], "hybrid"), (["--sparse"], "sparse"), (["--dense"], "dense")):
                # the command runs while the session holds the store open: it asks for its turn and gets it
                printed = docqueue("search", query, "--limit", "3", "--json", *flags, timeout=120)
                assert printed.returncode == 0, printed.stderr
                assert session.search(query, 3, mode=mode).as_dict() == json.loads(printed.stdout), (query, mode)
        best = session.search("bees pollinate clover", 1)
        assert best.mode == "hybrid" and best.hits[0].document == "bees.md"
        assert session.search("bees", 3, tenant="someone-else").hits == []


def test_a_session_searches_while_a_run_writes_and_the_run_completes(processed, tmp_path):
    ingest = docqueue("ingest", str(write_documents(tmp_path / "later", LATER)), "--json")
    assert ingest.returncode == 0, ingest.stderr
    searches, errors = 0, []
    with SearchSession(Settings.from_env()) as session:
        run = subprocess.Popen(
            [sys.executable, "-m", "orchestration.cli", "run", "--until-idle", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run.poll() is None and time.monotonic() < deadline:
            try:
                result = session.search("bees pollinate clover", 3)
                assert result.hits and result.hits[0].document == "bees.md"
                searches += 1
            except Exception as exc:  # noqa: BLE001  (every failure is reported below, not just the first)
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)
        out, err = run.communicate(timeout=60)
        assert not errors, errors[:3]
        assert run.returncode == 0, err
        assert searches > 0
        summary = json.loads(out)["summary"]
        assert summary["failed"] == 0 and summary["open"] == 0, summary
        # what the run wrote is found by the same session once the run let go of the store
        assert session.search("glacier meltwater flooded the valley", 1).hits[0].document == "glacier.md"


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_bytes(path: Path) -> int:
    """How much of `path` the page cache holds (mincore(2) over a mapping of it, made and dropped here)."""
    size = path.stat().st_size
    if not size:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            assert _LIBC.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
            return sum(flag & 1 for flag in pages.raw) * mmap.PAGESIZE
        finally:
            _LIBC.munmap(address, size)
    finally:
        os.close(fd)


def evicted(paths: list[Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_docqueue_search_leaves_what_it_read_in_the_page_cache(processed):
    """Qdrant Edge evicts a shard's files from the page cache as it closes the shard. `docqueue search` ends with its
    shards open, so the stored vectors and payloads it read stay cached for the next search, and its end lets go of
    the store for the next process."""
    segments = [p for p in (Path(os.environ["DOCQUEUE_QDRANT_PATH"]) / "edge").rglob("segments/*/*/*") if p.is_file()]
    stored = [p for p in segments if p.name.startswith(("chunk_", "page_"))]  # dense vectors, payloads
    assert stored, sorted(str(p) for p in segments)
    for query in ("bees pollinate clover", "lava and ash at night"):
        evicted(stored)
        assert sum(cached_bytes(p) for p in stored) == 0
        printed = docqueue("search", query, "--limit", "1", "--json", timeout=120)
        assert printed.returncode == 0, printed.stderr
        assert json.loads(printed.stdout)["hits"], printed.stdout
        assert sum(cached_bytes(p) for p in stored) > 0, "the search's end evicted what it read"
    with SearchSession(Settings.from_env(), keep_open_s=0) as session:  # the store is free at once
        assert session.search("lava and ash at night", 1).hits[0].document == "volcano.md"
