"""The embedded Bolt server's database folder read as files (resources/bolt_files.py): a real folder, written by a
real ArcadeDB server of this module's own and stopped, then copied and damaged one way per case. Each damage is
named, a whole folder is not, and the server refuses to start on a damaged one (before any JVM starts), so the
damage is not absorbed into a rewritten schema. The same for a folder whose server was SIGKILLed (no
statistics.json, a write-ahead log instead): once after its first writes, where a bucket cut to nothing is whole
again after the log's replay, and again after writes that followed a replay, where it is not."""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from processing.entities import ChunkGraph, Entity, Extraction, Relation
from resources.bolt_files import folder_damage
from resources.bolt_graph import GraphStore
from resources.bolt_server import BoltServer
from resources.ports import GraphStoreDamaged
from tests.integration.bolt_fixture import free_port


def _one(folder: Path, pattern: str) -> Path:
    return sorted(folder.glob(pattern))[0]


# what is done to a copy of the folder, and the start of what folder_damage says
DAMAGES = {
    "deleted vertex bucket": (lambda f: _one(f, "Chunk_0.*.bucket").unlink(), "the file of Chunk_0 is missing"),
    "deleted edge bucket": (lambda f: _one(f, "RELATED_TO_0.*.bucket").unlink(), "the file of RELATED_TO_0"),
    "deleted edge list": (lambda f: _one(f, "Entity_0_out_edges.*").unlink(), "the file of Entity_0_out_edges"),
    "cut bucket": (lambda f: os.truncate(_one(f, "Entity_0.*.bucket"), 0), "the bucket file Entity_0."),
    "bucket cut mid-page": (lambda f: os.truncate(_one(f, "Chunk_0.*.bucket"), 1000), "the bucket file Chunk_0."),
    "cut schema": (lambda f: os.truncate(f / "schema.json", 0), "its schema.json is missing or unreadable"),
    "deleted schema": (lambda f: (f / "schema.json").unlink(), "its schema.json is missing or unreadable"),
    "deleted dictionary": (lambda f: _one(f, "dictionary.*").unlink(), "its dictionary file is missing"),
    "deleted index": (lambda f: _one(f, "Chunk_0_*.umtidx").unlink(), "the file of Chunk_0_"),
}


# found only through statistics.json, which a clean close writes: after a kill the bucket's pages are on disk or in
# the write-ahead log from their first version, and the log's replay writes them back
NEEDS_CLEAN_CLOSE = {"cut bucket"}

# what is done to a copy of a folder whose server was SIGKILLed after writes that followed a replay of its log
KILLED_DAMAGES = {
    "cut vertex bucket": (lambda f: os.truncate(_one(f, "Chunk_0.*.bucket"), 0), "the bucket file Chunk_0."),
    "cut edge bucket": (lambda f: os.truncate(_one(f, "RELATED_TO_0.*.bucket"), 0), "the bucket file RELATED_TO_0."),
    "deleted edge list": (lambda f: _one(f, "Entity_0_out_edges.*").unlink(), "the file of Entity_0_out_edges"),
    "deleted unwritten edge list": (
        lambda f: _one(f, "Document_0_in_edges.*").unlink(),
        "the file of Document_0_in_edges is missing",
    ),
}


def _write(server: BoltServer, first: int, count: int) -> None:
    uri = server.ensure_running(timeout_s=120)
    with GraphStore(uri, server.user, server.password, server.database) as graph:
        chunks = []
        for i in range(first, first + count):
            people = [Entity(f"Person {i}", "PERSON"), Entity(f"Town {i % 3}", "PLACE")]
            relation = Relation(people[0].key, people[1].key, "LIVES_IN")
            chunks.append(
                ChunkGraph(f"doc{i % 2}", "a.pdf", i % 2, uuid.uuid4().hex, i, Extraction(people, [relation]))
            )
        graph.write_chunks(chunks)


def kill_server(server: BoltServer) -> None:
    """SIGKILL the server, as a killed test process or machine leaves it: no statistics.json, its log kept."""
    pid = server._our_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if server._our_pid() is None:
            break
        time.sleep(0.1)
    server.stop()  # only forgets the dead server's state file


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A stopped server's home whose database holds a few documents, chunks, entities and relations."""
    home = tmp_path_factory.mktemp("bolt-files")
    server = BoltServer(home, port=free_port())
    try:
        _write(server, 0, 12)
    finally:
        server.stop()
    return home


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, Path]:
    """Two homes whose server was SIGKILLed: after its first writes (`once`), and (`twice`) again after a start
    that replayed the log and more writes, so pages of the first are on disk and in no log."""
    once, twice = tmp_path_factory.mktemp("bolt-killed-once"), tmp_path_factory.mktemp("bolt-killed-twice")
    server = BoltServer(twice, port=free_port())
    try:
        _write(server, 0, 12)
        kill_server(server)
        shutil.copytree(twice, once, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lock", "server.json"))
        _write(server, 12, 12)
        kill_server(server)
    finally:
        server.stop()
    for home in (once, twice):
        folder = BoltServer(home).database_folder
        assert not (folder / "statistics.json").exists() and any(folder.glob("txlog_*.wal")), sorted(folder.iterdir())
    return once, twice


def _closed_cleanly(folder: Path) -> bool:
    """Whether the server wrote statistics.json as it closed the database. A shutdown that outlasts stop()'s grace
    ends in SIGKILL and leaves none (seen at load 5, and in every try of a full clean-clone run here)."""
    return (folder / "statistics.json").is_file()


def test_a_whole_folder_is_whole_and_a_missing_one_is_not_damage(written, tmp_path):
    assert folder_damage(BoltServer(written).database_folder) is None
    assert folder_damage(tmp_path / "never-made") is None


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_each_damage_is_named_and_the_server_refuses_to_start_on_it(written, tmp_path, case):
    home = tmp_path / "home"
    shutil.copytree(written, home, ignore=shutil.ignore_patterns(".lock", "server.json"))
    server = BoltServer(home, port=free_port())
    act, said = DAMAGES[case]
    if case in NEEDS_CLEAN_CLOSE and not _closed_cleanly(server.database_folder):
        pytest.skip(f"the server was killed, not closed: the replay of its log writes the {case} back")
    act(server.database_folder)
    _assert_named_and_refused(server, home, said)


def test_a_killed_servers_folder_is_whole(killed):
    for home in killed:
        assert folder_damage(BoltServer(home).database_folder) is None, home


@pytest.mark.parametrize("case", sorted(KILLED_DAMAGES))
def test_each_damage_of_a_killed_servers_folder_is_named_and_the_server_refuses_to_start(killed, tmp_path, case):
    home = tmp_path / "home"
    shutil.copytree(killed[1], home, ignore=shutil.ignore_patterns(".lock", "server.json"))
    server = BoltServer(home, port=free_port())
    act, said = KILLED_DAMAGES[case]
    act(server.database_folder)
    _assert_named_and_refused(server, home, said)


def test_a_bucket_cut_to_nothing_whose_pages_the_log_holds_whole_is_not_damage(killed, tmp_path):
    """After one kill, every page is in the log from its first version: the replay writes the cut bucket back."""
    home = tmp_path / "home"
    shutil.copytree(killed[0], home, ignore=shutil.ignore_patterns(".lock", "server.json"))
    server = BoltServer(home, port=free_port())
    os.truncate(_one(server.database_folder, "Chunk_0.*.bucket"), 0)
    assert folder_damage(server.database_folder) is None
    try:
        uri = server.ensure_running(timeout_s=120)
        with GraphStore(uri, server.user, server.password, server.database) as graph:
            counts = graph.counts()
    finally:
        server.stop()
    assert counts["chunks"] == 12 and counts["relationships"] == 12, counts


def _assert_named_and_refused(server: BoltServer, home: Path, said: str) -> None:
    found = folder_damage(server.database_folder)
    assert found is not None and found.startswith(said), found
    with pytest.raises(GraphStoreDamaged) as refused:
        server.ensure_running(timeout_s=30)
    assert str(refused.value).startswith(f"the graph database folder {server.database_folder} is damaged ({said}")
    assert not server.is_running() and not (home / "server.json").exists()
