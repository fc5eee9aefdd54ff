"""Where every task of the queue stands: what `docqueue run` reports when it ends, and what its exit code says.

A task is completed, failed (by error class), blocked (pending behind a failed task of an earlier phase: a page
whose OCR failed is never chunked, a chunk whose embedding failed never reaches GraphRAG) or open (pending or
processing, work still to come). A document's later phase is blocked the same way behind its failed earlier phase.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

# one row per task of each kind: (kind, status, error class, whether the gate it waits on failed). A document's
# expansion and a page's chunking are completed once their rows say so, whatever the rolled-up status shows.
_TASKS_SQL = """
WITH tasks AS (
    SELECT 'ocr_document' AS kind,
           CASE WHEN pages_created_at IS NOT NULL THEN 'completed' ELSE ocr_status::text END AS status,
           ocr_error_class AS error_class, false AS gate_failed
    FROM documents
    UNION ALL SELECT 'ocr_page', ocr_status::text, ocr_error_class, false FROM task_queue_page
    UNION ALL SELECT 'vector_page', CASE WHEN chunked_at IS NOT NULL THEN 'completed' ELSE vector_status::text END,
                     vector_error_class, ocr_status = 'failed'
              FROM task_queue_page
    UNION ALL SELECT 'vector_chunk', vector_status::text, vector_error_class, false FROM task_queue_chunk
    UNION ALL SELECT 'graphrag_chunk', graphrag_status::text, graphrag_error_class, vector_status = 'failed'
              FROM task_queue_chunk
)
SELECT kind,
       CASE WHEN status = 'failed' THEN 'failed' WHEN status = 'completed' THEN 'completed'
            WHEN status = 'pending' AND gate_failed THEN 'blocked' ELSE 'open' END AS outcome,
       CASE WHEN status = 'failed' THEN COALESCE(error_class, 'unclassified') END AS error_class,
       count(*) AS n
FROM tasks GROUP BY 1, 2, 3
"""

_BLOCKED_DOCUMENTS_SQL = """
SELECT count(*) FROM documents
WHERE (ocr_status = 'failed' AND vector_index_status IN ('pending', 'processing'))
   OR (vector_index_status = 'failed' AND graphrag_index_status IN ('pending', 'processing'))
"""


@dataclass
class Outcomes:
    completed: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # error class -> tasks
    blocked: int = 0
    open: int = 0
    blocked_documents: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> outcome -> tasks

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def clean(self) -> bool:
        """Nothing failed and nothing waits behind a failure."""
        return not self.failed_total and not self.blocked and not self.blocked_documents

    def as_dict(self) -> dict:
        return {"completed": self.completed, "failed": self.failed_total, "failed_by_error_class": self.failed,
                "blocked": self.blocked, "blocked_documents": self.blocked_documents, "open": self.open,
                "by_kind": self.by_kind}

    def sentence(self) -> str:
        classes = ", ".join(f"{name}: {n}" for name, n in sorted(self.failed.items()))
        return (f"{self.completed} task(s) completed, {self.failed_total} failed" + (f" ({classes})" if classes else "")
                + f", {self.blocked} blocked behind failed ones ({self.blocked_documents} document(s) with a phase "
                  f"blocked), {self.open} open")


def task_outcomes(engine: sa.Engine) -> Outcomes:
    outcomes = Outcomes()
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(_TASKS_SQL).all()
        outcomes.blocked_documents = int(conn.exec_driver_sql(_BLOCKED_DOCUMENTS_SQL).scalar())
    for kind, outcome, error_class, n in rows:
        n = int(n)
        per_kind = outcomes.by_kind.setdefault(kind, {})
        per_kind[outcome] = per_kind.get(outcome, 0) + n
        if outcome == "failed":
            outcomes.failed[error_class] = outcomes.failed.get(error_class, 0) + n
        else:
            setattr(outcomes, outcome, getattr(outcomes, outcome) + n)
    return outcomes
