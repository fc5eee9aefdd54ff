"""Cross-checks of the queue against Qdrant and the graph (`docqueue verify`, the nightly job, asset checks).

Both sides are streamed, DOCQUEUE_VERIFY_PAGE chunk ids at a time, so memory stays bounded at any corpus size
(the problems found are kept, since they are what gets repaired):
- queue -> store: completed chunks are read by keyset pagination on the primary key, and each page is looked up
  in the vector store by id (`present_chunk_ids`);
- store -> queue: the store's chunk ids are read a page at a time (`chunk_id_pages`) into a temporary table,
  then matched against the queue in one hash join whose result is read through a server-side cursor (the chunk
  table has no index on chunk_id, so a lookup per page would scan it once per page).
- the graph is read the second way only: its Chunk ids, each with the weight of its MENTIONS edges, a page at a
  time in id order, into a temporary table, then one join finds the completed chunks without a node or with fewer
  mentions than their extraction gave (graph_against_queue). A lookup by id costs the embedded Bolt server about
  0.8 ms, which at a million chunks would be 13 minutes a night; reading it in order costs a fifth of that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from queue_db.config import default
from queue_db.queue import TaskQueue
from queue_db.service_config import DagsterConfig

_FIRST_ID = "00000000-0000-0000-0000-000000000000"


@dataclass
class VerifyReport:
    completed_vector_chunks: int = 0
    points: int = 0
    chunks_without_point: list[str] = field(default_factory=list)  # queue row ids
    points_without_chunk: list[str] = field(default_factory=list)  # chunk ids
    # points whose chunk exists but has not completed its vector phase (re-queued, re-indexed): expected while
    # work is under way, so not an inconsistency; the asset check shows it
    points_of_unfinished_chunks: int = 0
    completed_graph_chunks: int = 0
    chunks_without_graph: list[str] = field(default_factory=list)  # queue row ids
    # queue row ids of chunks whose node has fewer MENTIONS edges than their extraction gave (graph_against_queue).
    # Not re-queued with those above: on the embedded server such edges are lost from a cut edge bucket whose edge
    # lists still name them, and a rewrite there doubles the edges (bench/faults.py row 7); `repair --graph` sets
    # that folder aside instead
    chunks_short_of_mentions: list[str] = field(default_factory=list)
    duplicate_entities: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not (
            self.chunks_without_point
            or self.points_without_chunk
            or self.chunks_without_graph
            or self.chunks_short_of_mentions
            or self.duplicate_entities
        )

    def as_dict(self) -> dict:
        return {
            "consistent": self.consistent,
            "completed_vector_chunks": self.completed_vector_chunks,
            "points": self.points,
            "chunks_without_point": len(self.chunks_without_point),
            "points_without_chunk": len(self.points_without_chunk),
            "points_of_unfinished_chunks": self.points_of_unfinished_chunks,
            "completed_graph_chunks": self.completed_graph_chunks,
            "chunks_without_graph": len(self.chunks_without_graph),
            "chunks_short_of_mentions": len(self.chunks_short_of_mentions),
            "duplicate_entities": len(self.duplicate_entities),
            "examples": {
                "chunks_without_point": self.chunks_without_point[:5],
                "points_without_chunk": self.points_without_chunk[:5],
                "chunks_without_graph": self.chunks_without_graph[:5],
                "chunks_short_of_mentions": self.chunks_short_of_mentions[:5],
                "duplicate_entities": self.duplicate_entities[:5],
            },
        }


def completed_chunk_pages(queue: TaskQueue, phase: str, page_size: int) -> Iterator[list[tuple[str, str]]]:
    """(chunk_id, queue row id) of the chunks whose `phase` completed, a page at a time in row-id order."""
    after = _FIRST_ID
    while True:
        with queue.engine.connect() as conn:
            page = [
                (r[0], r[1])
                for r in conn.exec_driver_sql(
                    # ordered by the uuid column itself (not the text it is selected as), so a page is a range of the
                    # primary key's index, not a sort of the whole table
                    f"""SELECT t.chunk_id, t.id::text FROM task_queue_chunk t
                    WHERE t.{phase}_status = 'completed' AND t.id > %(after)s::uuid ORDER BY t.id LIMIT %(n)s""",
                    {"after": after, "n": page_size},
                ).all()
            ]
        if page:
            yield page
        if len(page) < page_size:
            return
        after = page[-1][1]


def verify_stores(
    queue: TaskQueue, vector_store=None, graph_store=None, page_size: int = default(DagsterConfig, "verify_page")
) -> VerifyReport:
    """`page_size`: DOCQUEUE_VERIFY_PAGE, which callers pass from their settings."""
    report = VerifyReport()
    if vector_store is not None:
        for page in completed_chunk_pages(queue, "vector", page_size):
            present = vector_store.present_chunk_ids([chunk_id for chunk_id, _ in page])
            report.completed_vector_chunks += len(page)
            report.chunks_without_point += [row for chunk_id, row in page if chunk_id not in present]
        report.points, unknown, unfinished = _points_against_queue(queue, vector_store.chunk_id_pages(page_size))
        report.points_without_chunk, report.points_of_unfinished_chunks = sorted(unknown), unfinished
        report.chunks_without_point.sort()
    if graph_store is not None:
        report.completed_graph_chunks, report.chunks_without_graph, report.chunks_short_of_mentions = (
            graph_against_queue(queue, graph_store.chunk_mention_pages(page_size))
        )
        report.duplicate_entities = list(graph_store.duplicate_entities())
    return report


def verify_documents(queue: TaskQueue, document_ids: list[str], vector_store=None, graph_store=None) -> VerifyReport:
    """`verify_stores` for these documents only (a roll-up's): each one's completed chunks against the store's
    chunks of that document, both directions. The cost is the documents', whatever the corpus holds; entity
    duplicates are the nightly check's (they are not any one document's)."""
    report = VerifyReport()
    phase = "vector" if vector_store is not None else "graphrag"
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"""SELECT t.document_id::text, t.chunk_id, t.id::text, t.{phase}_status = 'completed'
                FROM task_queue_chunk t WHERE t.document_id = ANY(%(ids)s::uuid[])""",
            {"ids": list(document_ids)},
        ).all()
    chunks: dict[str, dict[str, tuple[str, bool]]] = {document_id: {} for document_id in document_ids}
    for document_id, chunk_id, row_id, completed in rows:
        chunks.setdefault(document_id, {})[chunk_id] = (row_id, bool(completed))
    for document_id, known in chunks.items():
        completed = {chunk_id: row_id for chunk_id, (row_id, done) in known.items() if done}
        if vector_store is not None:
            stored = vector_store.chunk_ids(document_id)
            report.completed_vector_chunks += len(completed)
            report.points += len(stored)
            report.chunks_without_point += [row for chunk_id, row in completed.items() if chunk_id not in stored]
            report.points_without_chunk += sorted(stored - known.keys())
            report.points_of_unfinished_chunks += len((stored & known.keys()) - completed.keys())
        if graph_store is not None:
            written = graph_store.chunk_ids_with_writes(document_id)
            report.completed_graph_chunks += len(completed)
            report.chunks_without_graph += [row for chunk_id, row in completed.items() if chunk_id not in written]
    return report


def graph_against_queue(queue: TaskQueue, pages: Iterable[list[tuple[str, int]]]) -> tuple[int, list[str], list[str]]:
    """(chunks whose GraphRAG phase completed, the queue row ids of those without a Chunk node, those whose node has
    fewer mentions than their extraction gave), the ids sorted. `pages`: (chunk id, mention weight), as
    GraphStore.chunk_mention_pages reads them.

    A chunk's mention weight counts each of its MENTIONS edges as its target plus the short forms in its `aliases`;
    `entities_extracted` is the number of distinct keys the chunk's extraction gave. Every such key is an edge's
    target or one of its aliases, so with all its edges there the weight is at least that number, equal when no
    short form was resolved; an edge lost takes its whole weight with it. A chunk whose short form and full name
    share one edge counts one more than it stands for, so there a single lost edge weighing one goes unseen."""
    with _loaded("docqueue_verify_graph", queue, pages, "mentions integer") as conn:
        completed = conn.exec_driver_sql(
            "SELECT count(*) FROM task_queue_chunk WHERE graphrag_status = 'completed'"
        ).scalar()
        result = conn.exec_driver_sql(
            """SELECT t.id::text, g.chunk_id IS NULL FROM task_queue_chunk t
               LEFT JOIN docqueue_verify_graph g ON g.chunk_id = t.chunk_id
               WHERE t.graphrag_status = 'completed' AND (g.chunk_id IS NULL OR g.mentions < t.entities_extracted)""",
            execution_options={"stream_results": True, "yield_per": 1000},
        )
        missing, short = [], []
        for row_id, without_node in result:
            (missing if without_node else short).append(row_id)
        conn.commit()
    return completed, sorted(missing), sorted(short)


@contextmanager
def _loaded(table: str, queue: TaskQueue, pages: Iterable[list], column: str = "") -> Iterator:
    """A connection holding a temporary table `table` (chunk_id text, and `column` when given) filled from `pages`
    (chunk ids, or (chunk id, value) pairs with `column`), committed page by page so that no transaction stays open
    while the store is read; dropped afterwards."""
    with queue.engine.connect() as conn:
        conn.exec_driver_sql(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {table} (chunk_id text{', ' + column if column else ''})"
        )
        conn.exec_driver_sql(f"TRUNCATE {table}")
        conn.commit()
        try:
            for page in pages:
                if column:
                    values = {"ids": [chunk_id for chunk_id, _ in page], "values": [value for _, value in page]}
                    conn.exec_driver_sql(
                        f"INSERT INTO {table} SELECT * FROM unnest(%(ids)s::text[], %(values)s::int[])", values
                    )
                else:
                    conn.exec_driver_sql(f"INSERT INTO {table} SELECT unnest(%(ids)s::text[])", {"ids": page})
                conn.commit()
            conn.exec_driver_sql(f"ANALYZE {table}")
            yield conn
        finally:
            conn.rollback()
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            conn.commit()


def _points_against_queue(queue: TaskQueue, pages: Iterable[list[str]]) -> tuple[int, list[str], int]:
    """(points read, chunk ids without a queue row, points whose chunk has not completed its vector phase)."""
    points, unknown, unfinished = 0, [], 0

    def counted(pages_):
        nonlocal points
        for page in pages_:
            points += len(page)
            yield page

    with _loaded("docqueue_verify_points", queue, counted(pages)) as conn:
        result = conn.exec_driver_sql(
            """SELECT v.chunk_id, c.vector_status IS NOT NULL FROM docqueue_verify_points v
               LEFT JOIN task_queue_chunk c ON c.chunk_id = v.chunk_id
               WHERE c.vector_status IS DISTINCT FROM 'completed'""",
            execution_options={"stream_results": True, "yield_per": 1000},
        )
        for chunk_id, known in result:
            if known:
                unfinished += 1
            else:
                unknown.append(chunk_id)
        conn.commit()
    return points, unknown, unfinished
