"""Short forms resolved to the full name within a document, on a real Bolt server: one node per person, aliases on
the mentions, the same graph whatever order and batching the chunks arrive in, no duplicates on re-runs, and deletes
that still remove exactly what a document brought."""

from __future__ import annotations

import threading
import time

import resources.bolt_graph as graph_module
from resources.bolt_graph import GraphStore
from tests.integration.test_graph_store import chunk, relationship_weights

FULL = chunk(
    "book",
    1,
    0,
    [("Lawrence Lessig", "PERSON"), ("Stanford University", "ORG")],
    [("Lawrence Lessig", "Stanford University", "TEACH_AT")],
)
SHORT = chunk("book", 2, 1, [("Lessig", "PERSON"), ("Jack Valenti", "PERSON")], [("Lessig", "Jack Valenti", "MEET")])
BOTH = chunk(
    "book",
    3,
    2,
    [("Lessig", "PERSON"), ("Lawrence Lessig", "PERSON"), ("Jack Valenti", "PERSON")],
    [("Lessig", "Jack Valenti", "DEBATE"), ("Lessig", "Lawrence Lessig", "CO_OCCURS")],
)


def snapshot(store: GraphStore) -> dict:
    entities = store._read("MATCH (e:Entity) RETURN e.key AS key, e.name AS name, e.type AS type")
    mentions = store._read(
        "MATCH (c:Chunk)-[m:MENTIONS]->(e:Entity) RETURN c.id AS chunk, e.key AS key, m.aliases AS aliases"
    )
    return {
        "counts": store.counts(),
        "entities": sorted((r["key"], r["name"], r["type"]) for r in entities),
        "mentions": sorted((r["chunk"], r["key"], tuple(r["aliases"] or ())) for r in mentions),
        "relations": relationship_weights(store),
    }


EXPECTED_MENTIONS = [
    ("book:1:0", "lawrence lessig", ()),
    ("book:1:0", "stanford university", ()),
    ("book:2:1", "jack valenti", ()),
    ("book:2:1", "lawrence lessig", ("lessig",)),
    ("book:3:2", "jack valenti", ()),
    ("book:3:2", "lawrence lessig", ("lessig",)),
]


def test_a_surname_after_the_full_name_is_the_same_node_and_a_rerun_writes_nothing_new(graph_store):
    graph_store.write_chunks([FULL, SHORT, BOTH])
    first = snapshot(graph_store)
    assert first["mentions"] == EXPECTED_MENTIONS
    assert [key for key, _, _ in first["entities"]] == ["jack valenti", "lawrence lessig", "stanford university"]
    assert ("lawrence lessig", "Lawrence Lessig", "PERSON") in first["entities"]
    assert set(first["relations"]) == {
        ("lawrence lessig", "stanford university", "TEACH_AT"),
        ("lawrence lessig", "jack valenti", "MEET"),
        ("lawrence lessig", "jack valenti", "DEBATE"),
    }  # the self-relation is gone

    for rerun in ([FULL, SHORT, BOTH], [BOTH], [SHORT], [SHORT, FULL]):
        graph_store.write_chunks(rerun)
        assert snapshot(graph_store) == first, rerun
    assert graph_store.duplicate_entities() == []


def test_the_short_form_first_is_repointed_when_the_full_name_arrives(graph_store, bolt_server):
    graph_store.write_chunks([FULL, SHORT, BOTH])
    together = snapshot(graph_store)

    for order in ([[SHORT], [FULL], [BOTH]], [[SHORT], [BOTH], [FULL]], [[BOTH], [SHORT], [FULL]]):
        graph_store.delete_document("book")
        assert graph_store.counts()["entities"] == 0
        graph_store.write_chunks(order[0])
        if order[0] == [SHORT]:  # alone, the surname is a node of its own, with its relation
            assert graph_store.entity("lessig")["name"] == "Lessig"
        for batch in order[1:]:
            graph_store.write_chunks(batch)
        assert snapshot(graph_store) == together, order


def test_parallel_writers_of_one_document_resolve_against_each_other(graph_store, bolt_server, monkeypatch):
    # the document exists before the race, so creating its node cannot be what orders the writers
    earlier = chunk("book", 9, 5, [("Creative Commons", "ORG")])
    graph_store.write_chunks([earlier, FULL, SHORT])
    expected = snapshot(graph_store)
    resolve = graph_module._document_aliases

    def slow_resolve(*args):
        # holds each writer between reading the document's entities and writing, so both read before either commits
        found = resolve(*args)
        time.sleep(0.3)
        return found

    monkeypatch.setattr(graph_module, "_document_aliases", slow_resolve)
    for _ in range(3):
        graph_store.delete_document("book")
        graph_store.write_chunks([earlier])
        stores = [bolt_server.store(), bolt_server.store()]
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def write(store: GraphStore, part) -> None:
            try:
                start.wait()
                store.write_chunks([part])
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(store, part)) for store, part in zip(stores, (SHORT, FULL))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for store in stores:
            store.close()
        assert errors == []
        assert snapshot(graph_store) == expected


def test_documents_merge_only_by_exact_name(graph_store):
    other = chunk(
        "essay", 1, 0, [("Lessig", "PERSON"), ("Jack Valenti", "PERSON")], [("Lessig", "Jack Valenti", "MEET")]
    )
    graph_store.write_chunks([FULL, SHORT, other])
    found = graph_store.entity("lessig")
    assert found["name"] == "Lessig" and {m["filename"] for m in found["mentions"]} == {"essay.pdf"}
    full = graph_store.entity("Lawrence Lessig")
    assert full["aliases"] == ["lessig"] and {m["filename"] for m in full["mentions"]} == {"book.pdf"}
    assert relationship_weights(graph_store)[("lessig", "jack valenti", "MEET")] == (1, ["essay:1:0"])
    assert relationship_weights(graph_store)[("lawrence lessig", "jack valenti", "MEET")] == (1, ["book:2:1"])

    graph_store.delete_document("book")
    assert {key for key, _, _ in snapshot(graph_store)["entities"]} == {"lessig", "jack valenti"}
    graph_store.delete_document("essay")
    assert graph_store.counts() == {"documents": 0, "pages": 0, "chunks": 0, "entities": 0, "relationships": 0}


def test_a_surname_two_people_share_stays_itself(graph_store):
    graph_store.write_chunks(
        [
            chunk("econ", 1, 0, [("Adam Smith", "PERSON"), ("John Smith", "PERSON")]),
            chunk("econ", 2, 1, [("Smith", "PERSON")]),
        ]
    )
    assert {key for key, _, _ in snapshot(graph_store)["entities"]} == {"adam smith", "john smith", "smith"}


def test_lookup_by_a_short_form_finds_the_full_name(graph_store):
    graph_store.write_chunks([SHORT, FULL])
    found = graph_store.entity("LESSIG")
    assert found["name"] == "Lawrence Lessig" and found["aliases"] == ["lessig"]
    assert {m["page_number"] for m in found["mentions"]} == {1, 2}
    assert {r["name"] for r in found["related"]} == {"Stanford University", "Jack Valenti"}
