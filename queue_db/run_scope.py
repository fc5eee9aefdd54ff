"""The documents one `docqueue run --max-docs N` works on: the N most urgent unfinished ones, taken from
idx_documents_unfinished (priority, then oldest), and whether any of them can still make progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .phases import PHASES, PhaseRegistry

if TYPE_CHECKING:
    import sqlalchemy as sa

MAX_DOCS = 1000


def among_documents(column: str, scoped: bool, alias: str = "t", joined: str = "WHERE") -> str:
    """` WHERE t.<column> = ANY(...)` (or `joined` another way): the rows of the run's documents, bound as
    `%(documents)s` (document_parameters), read through the table's document index; nothing when not `scoped`."""
    return f" {joined} {alias}.{column} = ANY(%(documents)s::uuid[])" if scoped else ""


def document_parameters(documents: Sequence[str] | None) -> list[dict]:
    """exec_driver_sql's optional parameters for a statement scoped by `among_documents`: none unscoped, so a
    statement of the whole queue is sent as it is."""
    return [{"documents": list(documents)}] if documents is not None else []


def unfinished_sql(phases: PhaseRegistry = PHASES) -> str:
    """Over documents d: not finished, its last phase can still run (a document waiting only on a task failed for
    good is not). For the default phases this is idx_documents_unfinished's predicate."""
    last = phases.phases[-1]
    return f"d.{last.document_status_column} IN ('pending', 'processing') AND NOT {phases.blocked_phase_sql(last, 'd')}"


def most_urgent_sql(phases: PhaseRegistry = PHASES) -> str:
    return (
        f"SELECT d.id::text FROM documents d WHERE {unfinished_sql(phases)} "
        "ORDER BY d.priority DESC, d.created_at, d.id LIMIT %(n)s"
    )


MOST_URGENT_SQL = most_urgent_sql()


def most_urgent_unfinished(engine: sa.Engine, count: int, phases: PhaseRegistry = PHASES) -> list[str]:
    """Ids of at most `count` unfinished documents, highest priority first, then oldest."""
    if not 1 <= count <= MAX_DOCS:
        raise ValueError(f"the number of documents must be between 1 and {MAX_DOCS}, got {count}")
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql(most_urgent_sql(phases), {"n": count})]


def still_unfinished(engine: sa.Engine, document_ids: Sequence[str], phases: PhaseRegistry = PHASES) -> int:
    """How many of these documents can still make progress."""
    if not document_ids:
        return 0
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                f"SELECT count(*) FROM documents d WHERE d.id = ANY(%(ids)s::uuid[]) AND {unfinished_sql(phases)}",
                {"ids": list(document_ids)},
            ).scalar_one()
        )
