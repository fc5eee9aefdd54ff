"""What the queue holds right now, per kind of task: tasks held by workers, stuck ones, failed ones backing off,
the workers holding tasks, and a document's running tasks. Every query is built from the kinds given (default:
PHASES' kinds) and the kinds' own predicates (queue_db.phases), so none of them can forget a kind or spell a
kind's rule differently.

Each reads the `processing` rows through the kinds' partial heartbeat indexes, or one document's rows through its
foreign-key index: the cost follows the work in flight, not the size of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .phases import ALL_KINDS, TaskKind

if TYPE_CHECKING:
    import sqlalchemy as sa


def _union(parts: list[str]) -> str:
    return "\nUNION ALL ".join(parts)


def held_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, count of tasks held by a worker."""
    return _union([f"SELECT '{k.name}' AS kind, count(*) AS n FROM {k.table} t WHERE {k.held_sql('t')}" for k in kinds])


def stuck_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, count of held tasks whose heartbeat is older than %(stale_s)s seconds."""
    return _union(
        [
            f"SELECT '{k.name}' AS kind, count(*) AS n FROM {k.table} t WHERE {k.held_sql('t')} "
            f"AND t.{k.col('last_heartbeat')} < now() - make_interval(secs => %(stale_s)s)"
            for k in kinds
        ]
    )


def stale_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, count (at most %(limit)s) of held tasks whose heartbeat is older than %(stale_s)s seconds: the oldest
    entries of each kind's partial heartbeat index, so the cost stays bounded whatever the corpus holds."""
    return _union(
        [
            f"SELECT '{k.name}' AS kind, (SELECT count(*) FROM (SELECT 1 FROM {k.table} t WHERE {k.held_sql('t')} "
            f"AND t.{k.col('last_heartbeat')} < now() - make_interval(secs => %(stale_s)s) "
            f"LIMIT %(limit)s) s) AS n"
            for k in kinds
        ]
    )


def next_retry_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, the earliest time a failed task of that kind backing off becomes claimable again."""
    return _union(
        [
            f"SELECT '{k.name}' AS kind, min(t.{k.col('next_attempt_at')}) AS at FROM {k.table} t "
            f"WHERE {k.backing_off_sql('t')}"
            for k in kinds
        ]
    )


def holders_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, worker id of every worker holding a task."""
    return _union(
        [
            f"SELECT DISTINCT '{k.name}' AS kind, t.{k.col('worker_id')} AS worker FROM {k.table} t "
            f"WHERE {k.held_sql('t')}"
            for k in kinds
        ]
    )


def document_held_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, count of tasks of document %(document_id)s held by a worker."""
    return _union(
        [
            f"SELECT '{k.name}' AS kind, count(*) AS n FROM {k.table} t "
            f"WHERE t.{k.document_column} = %(document_id)s AND {k.held_sql('t')}"
            for k in kinds
        ]
    )


def tenant_held_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS) -> str:
    """kind, count of tasks of tenant %(tenant)s's documents held by a worker (read through the heartbeat indexes)."""
    return _union(
        [
            f"SELECT '{k.name}' AS kind, count(*) AS n FROM {k.table} t "
            f"JOIN documents d ON d.id = t.{k.document_column} "
            f"WHERE d.tenant_id = %(tenant)s AND {k.held_sql('t')}"
            for k in kinds
        ]
    )


def tenant_held_count(conn: sa.Connection, tenant: str, kinds: tuple[TaskKind, ...] = ALL_KINDS) -> int:
    return sum(int(r[1]) for r in conn.exec_driver_sql(tenant_held_sql(kinds), {"tenant": tenant}).all())


def held_counts(conn: sa.Connection) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in conn.exec_driver_sql(held_sql()).all()}


def stuck_counts(conn: sa.Connection, stale_s: float) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in conn.exec_driver_sql(stuck_sql(), {"stale_s": stale_s}).all()}


def stale_counts(
    conn: sa.Connection, stale_s: float, kinds: tuple[TaskKind, ...] = ALL_KINDS, limit: int = 1000
) -> dict[str, int]:
    """Per kind, how many held tasks (counting at most `limit`) have a heartbeat older than `stale_s` seconds."""
    return {r[0]: int(r[1]) for r in conn.exec_driver_sql(stale_sql(kinds), {"stale_s": stale_s, "limit": limit})}


@dataclass(frozen=True)
class Outlook:
    """The queue at one instant: tasks held by workers, the wait until the first back-off ends (None when nothing
    backs off) and, per kind, the tasks claimable now (a count, or 1/0 when only asked whether any)."""

    held: int
    next_retry_in_s: float | None
    ready: dict[str, int]

    @property
    def settled(self) -> bool:
        """Nothing held, nothing backing off, nothing claimable: no work will appear unless someone adds it."""
        return not self.held and self.next_retry_in_s is None and not any(self.ready.values())


def outlook_sql(kinds: tuple[TaskKind, ...] = ALL_KINDS, *, count_ready: bool = False) -> str:
    """One statement, so one snapshot: read apart, a task claimed between the reads of the held and the claimable
    tasks is in neither, and a queue with work left looks settled."""
    held = f"(SELECT COALESCE(sum(h.n), 0) FROM ({held_sql(kinds)}) h)"
    soonest = f"(SELECT min(r.at) FROM ({next_retry_sql(kinds)}) r)"
    ready = [
        f"(SELECT count(*) FROM {k.table} t WHERE {k.claimable_sql('t')})"
        if count_ready
        else f"(EXISTS (SELECT 1 FROM {k.table} t WHERE {k.claimable_sql('t')}))::int"
        for k in kinds
    ]
    return f"SELECT {held} AS held, EXTRACT(EPOCH FROM {soonest} - now())::float8 AS next_retry_in_s, " + ", ".join(
        f"{part} AS ready_{i}" for i, part in enumerate(ready)
    )


def outlook(engine: sa.Engine, kinds: tuple[TaskKind, ...] = ALL_KINDS, *, count_ready: bool = False) -> Outlook:
    """What `run --until-idle` and a worker of `run --workers N` decide to leave on. Held and backing-off tasks are
    read through the heartbeat and failed-rows indexes, the claimable ones through the claim indexes (the first
    entry of each, unless `count_ready`)."""
    with engine.connect() as conn:
        row = conn.exec_driver_sql(outlook_sql(kinds, count_ready=count_ready)).one()
    return Outlook(
        held=int(row[0]), next_retry_in_s=row[1], ready={k.name: int(n) for k, n in zip(kinds, row[2:], strict=True)}
    )


def holding_workers(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[1] for r in conn.exec_driver_sql(holders_sql()).all() if r[1]}


def document_held_counts(
    conn: sa.Connection, document_id: str, kinds: tuple[TaskKind, ...] = ALL_KINDS
) -> dict[str, int]:
    return {
        r[0]: int(r[1]) for r in conn.exec_driver_sql(document_held_sql(kinds), {"document_id": str(document_id)}).all()
    }


def expansions_without_outcome(
    engine: sa.Engine, kind: TaskKind, child_table: str, document_ids: list[str] | None = None
) -> dict[str, int]:
    """Of the documents (`document_ids`, else all) whose `kind` task expands them into `child_table` rows (a
    document's OCR task and its pages): how many completed without a child, and how many failed without a stated
    reason. 0 and 0 when every registered document has its children or a stated failure. Scoped, the documents'
    primary key and the children's document index bound the cost; unscoped (the nightly checks) it reads them all."""
    status, error = kind.status, kind.col("error")
    only = "" if document_ids is None else "AND t.id = ANY(%(ids)s::uuid[])"
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            f"""SELECT
                  count(*) FILTER (WHERE t.{status} = 'completed'
                                     AND NOT EXISTS (SELECT 1 FROM {child_table} c WHERE c.document_id = t.id)),
                  count(*) FILTER (WHERE t.{status} = 'failed' AND COALESCE(btrim(t.{error}), '') = ''),
                  count(*)
                FROM documents t WHERE t.{status} IN ('completed', 'failed') {only}""",
            {"ids": list(document_ids or ())},
        ).one()
    return {"completed_without_children": int(row[0]), "failed_without_reason": int(row[1]), "settled": int(row[2])}
