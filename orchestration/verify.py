"""Cross-checks of the queue against Qdrant and the graph (`docqueue verify`, the nightly job, asset checks)."""
from __future__ import annotations

from dataclasses import dataclass, field

from queue_db.queue import TaskQueue


@dataclass
class VerifyReport:
    completed_vector_chunks: int = 0
    points: int = 0
    chunks_without_point: list[str] = field(default_factory=list)  # queue row ids
    points_without_chunk: list[str] = field(default_factory=list)  # chunk ids
    completed_graph_chunks: int = 0
    chunks_without_graph: list[str] = field(default_factory=list)  # queue row ids
    duplicate_entities: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not (self.chunks_without_point or self.points_without_chunk or self.chunks_without_graph
                    or self.duplicate_entities)

    def as_dict(self) -> dict:
        return {"consistent": self.consistent, "completed_vector_chunks": self.completed_vector_chunks,
                "points": self.points, "chunks_without_point": len(self.chunks_without_point),
                "points_without_chunk": len(self.points_without_chunk),
                "completed_graph_chunks": self.completed_graph_chunks,
                "chunks_without_graph": len(self.chunks_without_graph),
                "duplicate_entities": len(self.duplicate_entities),
                "examples": {"chunks_without_point": self.chunks_without_point[:5],
                             "points_without_chunk": self.points_without_chunk[:5],
                             "chunks_without_graph": self.chunks_without_graph[:5],
                             "duplicate_entities": self.duplicate_entities[:5]}}


def completed_chunks(queue: TaskQueue, phase: str) -> dict[str, str]:
    """chunk_id -> queue row id of chunks whose `phase` completed."""
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f"SELECT chunk_id, id::text FROM task_queue_chunk WHERE {phase}_status = 'completed'").all()
    return {r[0]: r[1] for r in rows}


def verify_stores(queue: TaskQueue, vector_store=None, graph_store=None) -> VerifyReport:
    report = VerifyReport()
    if vector_store is not None:
        vector_done = completed_chunks(queue, "vector")
        all_chunk_ids = _all_chunk_ids(queue)
        point_ids = vector_store.chunk_ids()
        report.completed_vector_chunks, report.points = len(vector_done), len(point_ids)
        report.chunks_without_point = sorted(row for cid, row in vector_done.items() if cid not in point_ids)
        report.points_without_chunk = sorted(cid for cid in point_ids if cid not in all_chunk_ids)
    if graph_store is not None:
        graph_done = completed_chunks(queue, "graphrag")
        written = graph_store.chunk_ids_with_writes()
        report.completed_graph_chunks = len(graph_done)
        report.chunks_without_graph = sorted(row for cid, row in graph_done.items() if cid not in written)
        report.duplicate_entities = list(graph_store.duplicate_entities())
    return report


def _all_chunk_ids(queue: TaskQueue) -> set[str]:
    with queue.engine.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql("SELECT chunk_id FROM task_queue_chunk").all()}
