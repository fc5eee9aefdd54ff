"""The graph folder check's reading of ArcadeDB's write-ahead log (resources/bolt_files.py), on small folders built
here byte by byte: which pages a killed server's log holds, from which version, decides whether a bucket that lacks
them is cut. The real folders, written and killed by a real server, are tests/integration/test_bolt_files.py's."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from resources.bolt_files import folder_damage

PAGE = 64
MAGIC = 9371515385058702
FILE_IDS = {"Chunk_0": 1, "Chunk_0_out_edges": 2, "Chunk_0_in_edges": 3}


def transaction(tx_id: int, pages: list[tuple[int, int, int]]) -> bytes:
    """A logged transaction of (file id, page number, page version), each with a 16-byte delta."""
    body = b"".join(struct.pack(">iiiiii", f, n, 8, 23, v, 24) + bytes(16) for f, n, v in pages)
    return struct.pack(">qqii", tx_id, 0, len(pages), len(body)) + body + struct.pack(">iq", len(body), MAGIC)


def folder(tmp_path: Path, pages: dict[str, int], log: bytes = b"") -> Path:
    """A database folder with one vertex type, Chunk, its bucket and edge lists holding `pages` pages each."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "schema.json").write_text(json.dumps({"types": {"Chunk": {"type": "v", "buckets": ["Chunk_0"]}}}))
    (tmp_path / f"dictionary.0.{PAGE}.v1.dict").write_bytes(bytes(PAGE))
    for name, file_id in FILE_IDS.items():
        (tmp_path / f"{name}.{file_id}.{PAGE}.v0.bucket").write_bytes(bytes(PAGE * pages.get(name, 0)))
    if log:
        (tmp_path / "txlog_0.wal").write_bytes(log)
    return tmp_path


@pytest.mark.parametrize(
    ("pages", "logged", "cut"),
    [
        ({}, [], False),  # nothing written yet
        ({}, [(1, 0, 1), (2, 0, 1)], False),  # its pages only in the log, from their first version: replayed
        ({}, [(1, 0, 1), (1, 0, 2)], False),  # and changed again since
        ({}, [(1, 0, 2)], True),  # the log holds page 0 from version 2: version 1 was on disk
        ({"Chunk_0": 1}, [(1, 2, 1)], True),  # page 1 is in no log and not on disk
        ({"Chunk_0": 1}, [(1, 0, 5), (1, 1, 1)], False),  # page 0 on disk, page 1 in the log from version 1
        ({"Chunk_0_out_edges": 1}, [], True),  # an edge list holds pages, the vertex bucket none
    ],
)
def test_a_bucket_is_cut_when_a_page_it_had_is_neither_on_disk_nor_whole_in_the_log(tmp_path, pages, logged, cut):
    log = b"".join(transaction(i, [page]) for i, page in enumerate(logged))
    found = folder_damage(folder(tmp_path, pages, log))
    assert (found is not None and found.startswith("the bucket file Chunk_0.1.")) if cut else found is None, found


def test_a_torn_or_foreign_record_ends_the_log_as_the_replay_ends_it(tmp_path):
    whole = transaction(0, [(1, 0, 1)])
    later = transaction(1, [(1, 0, 7)])  # would say page 0 was on disk, were it read
    assert folder_damage(folder(tmp_path / "torn", {}, whole + later[:-5])) is None
    wrong_magic = later[:-8] + struct.pack(">q", MAGIC + 1)
    assert folder_damage(folder(tmp_path / "magic", {}, whole + wrong_magic)) is None
    assert folder_damage(folder(tmp_path / "garbage", {}, whole + b"\xff" * 100)) is None


def test_a_vertex_bucket_without_its_edge_list_file_is_damaged(tmp_path):
    built = folder(tmp_path, {"Chunk_0": 1})
    next(built.glob("Chunk_0_in_edges.*")).unlink()
    assert folder_damage(built) == "the file of Chunk_0_in_edges is missing"
