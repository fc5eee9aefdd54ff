"""The embedded Bolt server's database folder read as files (resources/bolt_files.py): a real folder, written by a
real ArcadeDB server of this module's own and stopped, then copied and damaged one way per case. Each damage is
named, a whole folder is not, and the server refuses to start on a damaged one (before any JVM starts), so the
damage is not absorbed into a rewritten schema."""

from __future__ import annotations

import os
import shutil
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


# found only through statistics.json, which a clean close writes: a bucket cut to nothing keeps whole pages, and
# an edge list's file is named by no schema entry (tried on a SIGKILLed server: both pass as whole without it)
NEEDS_CLEAN_CLOSE = {"cut bucket", "deleted edge list"}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A stopped server's home whose database holds a few documents, chunks, entities and relations."""
    home = tmp_path_factory.mktemp("bolt-files")
    server = BoltServer(home, port=free_port())
    try:
        uri = server.ensure_running(timeout_s=120)
        with GraphStore(uri, server.user, server.password, server.database) as graph:
            chunks = []
            for i in range(12):
                people = [Entity(f"Person {i}", "PERSON"), Entity(f"Town {i % 3}", "PLACE")]
                relation = Relation(people[0].key, people[1].key, "LIVES_IN")
                chunks.append(
                    ChunkGraph(f"doc{i % 2}", "a.pdf", i % 2, uuid.uuid4().hex, i, Extraction(people, [relation]))
                )
            graph.write_chunks(chunks)
    finally:
        server.stop()
    return home


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
        pytest.skip(f"the server was killed, not closed: no statistics.json shows the {case}")
    act(server.database_folder)
    found = folder_damage(server.database_folder)
    assert found is not None and found.startswith(said), found
    with pytest.raises(GraphStoreDamaged) as refused:
        server.ensure_running(timeout_s=30)
    assert str(refused.value).startswith(f"the graph database folder {server.database_folder} is damaged ({said}")
    assert not server.is_running() and not (home / "server.json").exists()
