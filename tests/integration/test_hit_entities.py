"""The graph beside search hits against a real Bolt server (embedded ArcadeDB, official neo4j driver):
GraphStore.chunk_entities keeps its bounds, its order and its tenant, reads each chunk and entity through its
constraint's index, and a server that does not answer is one sentence (resources/hit_entities.py)."""

from __future__ import annotations

import time

import pytest

from queue_db.config import Settings
from resources import bolt_cypher as cypher
from resources.bolt_graph import GraphStore
from resources.hit_entities import HitGraph
from resources.ports import GraphStoreUnavailable, MentionedEntity
from tests.integration.bolt_fixture import free_port
from tests.integration.test_graph_store import chunk

PEOPLE = [("Ada Lovelace", "PERSON"), ("Charles Babbage", "PERSON"), ("London", "GPE"), ("Analytical Engine", "ORG")]


def written(store: GraphStore) -> None:
    """A hit's chunk mentioning four entities, two more chunks relating one of them to others, a chunk without
    entities and the same hit's text in tenant acme."""
    store.write_chunks(
        [
            chunk("d1", 1, 0, PEOPLE, [("Ada Lovelace", "Charles Babbage", "CO_OCCURS")], chunk_id="hit"),
            chunk(
                "d2",
                1,
                0,
                [("Charles Babbage", "PERSON"), ("Michael Faraday", "PERSON"), ("Royal Society", "ORG")],
                [("Charles Babbage", "Michael Faraday", "WRITE_TO"), ("Royal Society", "Charles Babbage", "ELECT")],
                chunk_id="c2",
            ),
            chunk(
                "d3",
                1,
                0,
                [("Charles Babbage", "PERSON"), ("Michael Faraday", "PERSON")],
                [("Charles Babbage", "Michael Faraday", "WRITE_TO")],
                chunk_id="c3",
            ),
            chunk("d4", 1, 0, [], chunk_id="bare"),
        ]
    )
    acme = chunk("d5", 1, 0, PEOPLE[:2], chunk_id="acme-hit")
    acme.tenant_id = "acme"
    store.write_chunks([acme])


def test_each_chunk_gets_its_entities_within_the_bound_and_its_tenant(graph_store):
    written(graph_store)
    found = graph_store.chunk_entities(["hit", "bare", "never-written", "acme-hit"], per_chunk=3)
    assert set(found) == {"hit"}  # no entities, not in the graph, or another tenant's: absent
    assert found["hit"].entities == [
        MentionedEntity("Ada Lovelace", "PERSON"),
        MentionedEntity("Analytical Engine", "ORG"),
        MentionedEntity("Charles Babbage", "PERSON"),
    ]
    assert found["hit"].total == 4 and found["hit"].related == []
    acme = graph_store.chunk_entities(["hit", "acme-hit"], per_chunk=10, tenant="acme")
    assert set(acme) == {"acme-hit"} and [e.name for e in acme["acme-hit"].entities] == [
        "Ada Lovelace",
        "Charles Babbage",
    ]
    assert graph_store.chunk_entities(["hit"], per_chunk=0) == {} == graph_store.chunk_entities([], per_chunk=5)


def test_related_entities_are_the_strongest_relations_to_entities_the_hit_does_not_show(graph_store):
    written(graph_store)
    related = graph_store.chunk_entities(["hit"], per_chunk=4, related_per_chunk=2)["hit"].related
    assert [(r.entity, r.relation, r.weight, r.name, r.type, r.direction) for r in related] == [
        ("Charles Babbage", "WRITE_TO", 2, "Michael Faraday", "PERSON", "out"),
        ("Charles Babbage", "ELECT", 1, "Royal Society", "ORG", "in"),
    ]
    assert len(graph_store.chunk_entities(["hit"], per_chunk=4, related_per_chunk=1)["hit"].related) == 1
    # an entity the bound leaves out of the hit may be related to one it shows
    narrow = graph_store.chunk_entities(["hit"], per_chunk=1, related_per_chunk=5)["hit"]
    assert narrow.entities == [MentionedEntity("Ada Lovelace", "PERSON")]
    assert [(r.name, r.relation) for r in narrow.related] == [("Charles Babbage", "CO_OCCURS")]


def test_the_reads_seek_chunks_and_entities_through_their_constraints(graph_store):
    written(graph_store)
    keys = [{"chunk_id": "hit", "keys": ["ada lovelace", "charles babbage"]}]
    for query, params, index in (
        (
            cypher.CHUNK_ENTITIES,
            {"chunk_ids": ["hit"], "limit": 5, "tenant": "default", "base_tenant": "default"},
            "Chunk[id]",
        ),
        (cypher.RELATED_ENTITIES, {"rows": keys, "limit": 5}, "Entity[key]"),
    ):
        with graph_store._session() as session:
            summary = session.run("PROFILE " + query, **params).consume()
        plan = str(summary.profile)
        if "ArcadeDB" in plan:
            assert f"index: {index}" in plan and "SCAN" not in plan.upper(), plan
        else:  # Neo4j 5: the uniqueness constraint's index, never a label scan
            assert "IndexSeek" in plan and "NodeByLabelScan" not in plan and "AllNodesScan" not in plan, plan


def test_a_server_that_does_not_answer_is_one_sentence_and_left_alone_a_while(monkeypatch, tmp_path):
    down = GraphStore(f"bolt://127.0.0.1:{free_port()}", "neo4j", "secret-password", tx_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(GraphStoreUnavailable) as refused:
        down.chunk_entities(["hit"], per_chunk=5)
    assert time.monotonic() - started < 2 and "secret-password" not in str(refused.value)
    down.close()

    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCQUEUE_NEO4J_URI", "")
    assert HitGraph(Settings.from_env()).lookup(["hit"], "default") == ({}, None)  # no graph was ever written here
    (tmp_path / "home" / "bolt").mkdir(parents=True)
    (tmp_path / "home" / "bolt" / "root_password").write_text("made by its first start")
    stopped = HitGraph(Settings.from_env())
    assert stopped.lookup(["hit"], "default") == (
        {},
        "Entities are not shown: the embedded graph server is not running (`docqueue run` starts it).",
    )
    assert stopped._store is None  # a search never starts the embedded server
    monkeypatch.setenv("DOCQUEUE_NEO4J_URI", f"bolt://127.0.0.1:{free_port()}")
    monkeypatch.setenv("DOCQUEUE_NEO4J_PASSWORD", "secret-password")
    hits = HitGraph(Settings.from_env())
    try:
        found, notice = hits.lookup(["hit"], "default")
        assert found == {} and notice.startswith("Entities are not shown: the graph server did not answer")
        assert "secret-password" not in notice and hits.lookup(["hit"], "default") == ({}, notice)
        assert hits._store is not None and hits._quiet_until > time.monotonic()  # not asked again for a while
    finally:
        hits.close()
