"""Verification counts each chunk's MENTIONS edges in its paged walk over the real Bolt graph: a chunk whose edges
were deleted (as a SIGKILLed server's edge bucket cut to a page boundary loses them) is found and counted, while
the short forms a document resolves (one edge standing for two of the chunk's names, an edge moved when a later
chunk names the fuller form) never make a chunk look short."""

from __future__ import annotations

from orchestration.maintenance import nightly
from orchestration.verify import verify_stores
from processing.entities import ChunkGraph, Entity, Extraction
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK
from tests.queue_support import build_document

PAGE = 2
NAMES = [
    [("Lessig", "PERSON"), ("Creative Commons", "ORG")],  # written first: "Lessig" stands alone
    [("Lawrence Lessig", "PERSON"), ("Lessig", "PERSON")],  # one edge for both names, and the first chunk's moves
    [("Acme", "ORG"), ("Acme Corporation", "ORG"), ("Berlin", "GPE")],
    [("Berlin", "GPE"), ("Paris", "GPE"), ("Lessig", "PERSON")],
    [("Paris", "GPE"), ("Creative Commons", "ORG")],
    [("Acme Corp", "ORG"), ("Stanford", "ORG")],
]


def _written(queue, graph_store) -> tuple[list[dict], dict]:
    """Six chunks of one document written one at a time, as the pipeline writes them, and completed with the
    number of entities their extraction gave."""
    document = build_document(queue, pages=1, chunks_per_page=len(NAMES))
    vector = queue.claim(VECTOR_CHUNK, "verify-test", len(NAMES))
    queue.complete(VECTOR_CHUNK, "verify-test", [{"id": t["id"]} for t in vector])
    tasks = sorted(queue.claim(GRAPHRAG_CHUNK, "verify-test", len(NAMES)), key=lambda t: t["chunk_index"])
    for task, names in zip(tasks, NAMES):
        extraction = Extraction(entities=[Entity(name, type_) for name, type_ in names])
        graph_store.write_chunks(
            [ChunkGraph(str(document["id"]), "book.pdf", 1, task["chunk_id"], task["chunk_index"], extraction)]
        )
    queue.complete(
        GRAPHRAG_CHUNK, "verify-test", [{"id": t["id"], "entities_extracted": len(n)} for t, n in zip(tasks, NAMES)]
    )
    return tasks, document


def _edges(graph_store, chunk_id: str) -> list[tuple[str, list[str]]]:
    rows = graph_store._read(
        "MATCH (:Chunk {id: $id})-[m:MENTIONS]->(e:Entity) RETURN e.key AS key, m.aliases AS aliases", id=chunk_id
    )
    return sorted((row["key"], sorted(row["aliases"] or [])) for row in rows)


def _delete_mentions(graph_store, chunk_id: str, key: str | None = None) -> None:
    where = "" if key is None else " WHERE e.key = $key"
    graph_store._write(
        lambda tx: tx.run(
            f"MATCH (:Chunk {{id: $id}})-[m:MENTIONS]->(e:Entity){where} DELETE m", id=chunk_id, key=key
        ).consume()
    )


def test_resolved_short_forms_never_look_like_lost_mentions(queue, graph_store):
    tasks, _ = _written(queue, graph_store)
    # the relation verification relies on: the names resolved into fewer edges than the extraction gave
    assert _edges(graph_store, tasks[0]["chunk_id"]) == [("creative commons", []), ("lawrence lessig", ["lessig"])]
    assert _edges(graph_store, tasks[1]["chunk_id"]) == [("lawrence lessig", ["lessig"])]
    assert _edges(graph_store, tasks[2]["chunk_id"]) == [("acme corporation", ["acme"]), ("berlin", [])]
    weights = {c: n for page in graph_store.chunk_mention_pages(PAGE) for c, n in page}
    assert [weights[t["chunk_id"]] for t in tasks] == [3, 2, 3, 4, 2, 2]

    report = verify_stores(queue, graph_store=graph_store, page_size=PAGE)

    assert report.consistent, report.as_dict()
    assert report.completed_graph_chunks == len(NAMES)


def test_chunks_whose_mentions_were_deleted_are_found(queue, graph_store):
    tasks, _ = _written(queue, graph_store)
    # all of one chunk's edges, one edge of chunks on either side of a page boundary, the aliased edge of another
    _delete_mentions(graph_store, tasks[4]["chunk_id"])
    _delete_mentions(graph_store, tasks[3]["chunk_id"], "lawrence lessig")
    _delete_mentions(graph_store, tasks[5]["chunk_id"], "stanford")
    _delete_mentions(graph_store, tasks[2]["chunk_id"], "acme corporation")
    damaged = sorted(str(tasks[i]["id"]) for i in (2, 3, 4, 5))
    # the limit: "Lessig" alone counts its edge twice, so the chunk's one other edge, weighing one, goes unseen
    _delete_mentions(graph_store, tasks[0]["chunk_id"], "creative commons")

    report = verify_stores(queue, graph_store=graph_store, page_size=PAGE)

    assert report.chunks_short_of_mentions == damaged, report.as_dict()
    assert report.chunks_without_graph == [] and not report.consistent
    assert report.as_dict()["chunks_short_of_mentions"] == 4
    assert verify_stores(queue, graph_store=graph_store, page_size=1000).as_dict() == report.as_dict()

    # counted, not re-queued: a rewrite into an edge bucket cut short doubles the edges its lists still name
    result = nightly(queue, None, graph_store=graph_store, page_size=PAGE)

    assert result["requeued_graph_chunks"] == 0 and result["verification"]["chunks_short_of_mentions"] == 4, result
