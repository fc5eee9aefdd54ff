"""Where every task of the queue stands: what `docqueue run` reports when it ends, and what its exit code says.

A task is completed, failed (by error class), blocked (pending behind a task that failed for good: a page whose OCR
failed is never chunked, a chunk whose embedding failed never reaches GraphRAG) or open (pending or processing,
work still to come). A document's phase is blocked the same way. The rules are the kinds' own (queue_db.phases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .phases import PHASES, PhaseRegistry
from .run_scope import among_documents, document_parameters

if TYPE_CHECKING:
    import sqlalchemy as sa


def _tasks_sql(phases: PhaseRegistry = PHASES, scoped: bool = False) -> str:
    """kind, outcome, error class, tasks: one group per outcome of each kind, from the kinds' own predicates. A
    document's expansion and a page's chunking are completed once their status is their children's roll-up.
    `scoped`: only the documents of the `documents` parameter, read through each table's document index."""
    parts = []
    for k in phases.kinds:
        outcome = (
            f"CASE WHEN NOT ({k.owns('t')}) THEN 'completed' WHEN t.{k.status} = 'failed' THEN 'failed' "
            f"WHEN t.{k.status} = 'completed' THEN 'completed' WHEN {k.blocked_sql('t')} THEN 'blocked' "
            f"ELSE 'open' END"
        )
        error_class = (
            f"CASE WHEN ({k.owns('t')}) AND t.{k.status} = 'failed' "
            f"THEN COALESCE(t.{k.col('error_class')}, 'unclassified') END"
        )
        parts.append(
            f"SELECT '{k.name}' AS kind, {outcome} AS outcome, {error_class} AS error_class, count(*) AS n "
            f"FROM {k.table} t{among_documents(k.document_column, scoped)} GROUP BY 2, 3"
        )
    return "\nUNION ALL ".join(parts)


def _blocked_documents_sql(phases: PhaseRegistry = PHASES, scoped: bool = False) -> str:
    return (
        "SELECT count(*) FROM documents d WHERE ("
        + " OR ".join(phases.blocked_phase_sql(phase, "d") for phase in phases)
        + ")"
        + among_documents("id", scoped, "d", "AND")
    )


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
        return {
            "completed": self.completed,
            "failed": self.failed_total,
            "failed_by_error_class": self.failed,
            "blocked": self.blocked,
            "blocked_documents": self.blocked_documents,
            "open": self.open,
            "by_kind": self.by_kind,
        }

    def sentence(self) -> str:
        classes = ", ".join(f"{name}: {n}" for name, n in sorted(self.failed.items()))
        return (
            f"{self.completed} task(s) completed, {self.failed_total} failed"
            + (f" ({classes})" if classes else "")
            + f", {self.blocked} blocked behind failed ones ({self.blocked_documents} document(s) with a phase "
            f"blocked), {self.open} open"
        )


def task_outcomes(
    engine: sa.Engine, phases: PhaseRegistry = PHASES, documents: Sequence[str] | None = None
) -> Outcomes:
    """Every task's outcome, or only those of `documents` (ids): a count of the whole queue reads every row,
    0.7-0.8 s at a million chunks, while a run over a few documents reads only theirs."""
    outcomes = Outcomes()
    scoped = documents is not None
    params = document_parameters(documents)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(_tasks_sql(phases, scoped), *params).all()
        outcomes.blocked_documents = int(
            conn.exec_driver_sql(_blocked_documents_sql(phases, scoped), *params).scalar_one()
        )
    for kind, outcome, error_class, n in rows:
        n = int(n)
        per_kind = outcomes.by_kind.setdefault(kind, {})
        per_kind[outcome] = per_kind.get(outcome, 0) + n
        if outcome == "failed":
            outcomes.failed[error_class] = outcomes.failed.get(error_class, 0) + n
        else:
            setattr(outcomes, outcome, getattr(outcomes, outcome) + n)
    return outcomes
