"""The documents one `docqueue run --max-docs N` works on: the N most urgent unfinished ones, taken from
idx_documents_unfinished (priority, then oldest), and whether any of them can still make progress."""
from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa

from queue_db.phases import Phase, blocked_phase_sql

MAX_DOCS = 1000
# not finished: its last phase can still run (a document waiting only on a task failed for good is not)
_UNFINISHED = (f"d.graphrag_index_status IN ('pending', 'processing') "
               f"AND NOT {blocked_phase_sql(Phase.GRAPHRAG, 'd')}")
MOST_URGENT_SQL = (f"SELECT d.id::text FROM documents d WHERE {_UNFINISHED} "
                   "ORDER BY d.priority DESC, d.created_at, d.id LIMIT %(n)s")


def most_urgent_unfinished(engine: sa.Engine, count: int) -> list[str]:
    """Ids of at most `count` unfinished documents, highest priority first, then oldest."""
    if not 1 <= count <= MAX_DOCS:
        raise ValueError(f"the number of documents must be between 1 and {MAX_DOCS}, got {count}")
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql(MOST_URGENT_SQL, {"n": count})]


def still_unfinished(engine: sa.Engine, document_ids: Sequence[str]) -> int:
    """How many of these documents can still make progress."""
    if not document_ids:
        return 0
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(
            f"SELECT count(*) FROM documents d WHERE d.id = ANY(%(ids)s::uuid[]) AND {_UNFINISHED}",
            {"ids": list(document_ids)}).scalar())
