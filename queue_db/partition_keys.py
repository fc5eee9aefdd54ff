"""The bridge between queue rows and partition keys (no Dagster here: callers register the keys themselves).

- `unregistered()` lists rows whose partition key has not been registered yet, in block order;
- `record_block()` stores where a just-registered block of keys sits (block id, position);
- `ready_candidates()` lists claimable tasks with their block/position, in claim order, for run planning;
- `rows_for_keys()` maps partition keys of a run back to task rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from .keys import chunk_partition_key, document_partition_key, page_partition_key, parse_partition_key
from .phases import PHASES, TABLE_OF_LEVEL, Level, PhaseRegistry, PhaseSpec, TaskKind

if TYPE_CHECKING:
    import sqlalchemy as sa

TABLE = TABLE_OF_LEVEL

# columns giving (document_key, page_number, chunk_index) for rows of a level, aliased t
_KEY_SELECT = {
    Level.DOCUMENT: ("t.document_key AS document_key, NULL::int AS page_number, NULL::int AS chunk_index", ""),
    Level.PAGE: (
        "d.document_key AS document_key, t.page_number AS page_number, NULL::int AS chunk_index",
        "JOIN documents d ON d.id = t.document_id",
    ),
    Level.CHUNK: (
        "d.document_key AS document_key, p.page_number AS page_number, t.chunk_index AS chunk_index",
        "JOIN documents d ON d.id = t.document_id JOIN task_queue_page p ON p.id = t.page_id",
    ),
}
# what ready_candidates picks of a task row before joining it: its key's own parts and the parents' ids
_PICKED = {
    Level.DOCUMENT: "t.document_key",
    Level.PAGE: "t.document_id, t.page_number",
    Level.CHUNK: "t.document_id, t.page_id, t.chunk_index",
}
_BLOCK_ORDER = {
    Level.DOCUMENT: "t.created_at, t.id",
    Level.PAGE: "d.created_at, d.id, t.page_number",
    Level.CHUNK: "d.created_at, d.id, p.page_number, t.chunk_index",
}


def key_of(level: Level, row: Mapping[Any, Any]) -> str:
    if level is Level.DOCUMENT:
        return document_partition_key(row["document_key"])
    if level is Level.PAGE:
        return page_partition_key(row["document_key"], row["page_number"])
    return chunk_partition_key(row["document_key"], row["page_number"], row["chunk_index"])


class Candidate(NamedTuple):
    """A ready task (or a document due a roll-up) where its partition sits. A tuple, and its key formatted only when
    asked for, because a tick reads thousands and planning needs the keys at the ends of its ranges only."""

    id: str
    block: int
    pos: int
    retries: int
    document_key: str
    page_number: int | None
    chunk_index: int | None
    level: Level

    @property
    def key(self) -> str:
        return key_of(
            self.level,
            {"document_key": self.document_key, "page_number": self.page_number, "chunk_index": self.chunk_index},
        )


@dataclass(frozen=True)
class BlockShare:
    """The keys one of `of` cooperating runners plans (`docqueue run --workers`): a registration block of at least
    `of` x `min_keys` keys is cut into `of` contiguous shares of its positions (block sizes in `partition_blocks`),
    and runner `index` takes the share numbered (block + share) % of; a smaller block, or one without a recorded
    size, goes whole to runner block % of. Every runner thus has part of every big block, while a small one costs
    one run, not one per runner. Filtered in the query, so a runner's candidates are its own however the work is
    spread."""

    of: int
    index: int
    min_keys: int = 1

    def sql(self, alias: str = "t") -> str:
        of = int(self.of)
        size = f"(SELECT b.size FROM partition_blocks b WHERE b.block = {alias}.partition_block)"
        least = of * max(1, int(self.min_keys))
        part = f"COALESCE(CASE WHEN {size} >= {least} THEN {alias}.partition_pos * {of} / {size} END, 0)"
        return f"AND ({alias}.partition_block + {part}) %% {of} = {int(self.index)}"

    def for_runs_of(self, max_keys: int, least: int | None = None) -> "BlockShare":
        """This share for runs of at most `max_keys` keys: a block is split only when each runner's share holds
        enough work to pay for a run of its own, `least` keys once the kind's runs are measured
        (run_costs.least_keys), else a quarter of such a run, so a runner's run is not mostly its fixed cost."""
        return dataclasses.replace(self, min_keys=max(1, least if least is not None else max_keys // 4))


def unregistered(engine: sa.Engine, level: Level, limit: int = 10_000) -> list[dict]:
    """Rows without a registered partition, in the order their keys must be added (one block)."""
    select, joins = _KEY_SELECT[level]
    with engine.connect() as conn:
        rows = (
            conn.exec_driver_sql(
                f"""SELECT t.id::text AS id, {select} FROM {TABLE[level]} t {joins}
                WHERE t.partition_block IS NULL ORDER BY {_BLOCK_ORDER[level]} LIMIT %(n)s""",
                {"n": limit},
            )
            .mappings()
            .all()
        )
    return [{**dict(r), "key": key_of(level, r)} for r in rows]


def record_block(engine: sa.Engine, level: Level, ids_in_order: Sequence[str]) -> int | None:
    """Give the rows (registered in this order, in one call) a new block id and their positions."""
    if not ids_in_order:
        return None
    with engine.begin() as conn:
        block = conn.exec_driver_sql("SELECT nextval('docqueue_partition_block_seq')").scalar_one()
        conn.exec_driver_sql(
            f"""UPDATE {TABLE[level]} t SET partition_block = %(block)s, partition_pos = v.pos - 1
                FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS v(id, pos)
                WHERE t.id = v.id AND t.partition_block IS NULL""",
            {"block": block, "ids": list(ids_in_order)},
        )
        # the positions run to len(ids) - 1 whether or not another registration took some rows first
        conn.exec_driver_sql(
            "INSERT INTO partition_blocks (block, size) VALUES (%(block)s, %(size)s)",
            {"block": block, "size": len(ids_in_order)},
        )
    return int(block)


def ready_candidates_sql(
    kind: TaskKind, documents: bool = False, share: BlockShare | None = None
) -> tuple[tuple[str, ...], str]:
    """The planner settings and the statement of `ready_candidates` (parameters: n, documents)."""
    select, joins = _KEY_SELECT[kind.level]
    only = f"AND t.{kind.document_column} = ANY(%(documents)s::uuid[])" if documents else ""
    # The tasks are picked first, alone, by walking the claim index in its order: the walk stops after `n` tasks, so
    # its cost is the limit plus the tasks it steps over, whatever the table holds. Left to choose, the planner
    # read every claimable task and sorted them instead once they were tens of thousands among a million rows
    # (0.43 s per tick, against 0.04 s for the walk), so sorting is ruled out for this statement. A pick limited
    # to some documents is small: there the planner's choice stands.
    settings = () if documents else ("SET LOCAL enable_sort = off",)
    # Only the columns the key and the order need are picked, and only the picked rows are joined to their parents.
    return (
        settings,
        f"""WITH picked AS MATERIALIZED (
                    SELECT t.id, t.partition_block, t.partition_pos, t.priority, t.{kind.status},
                           t.{kind.col("retry_count")}, t.created_at, {_PICKED[kind.level]}
                    FROM {kind.table} t
                    WHERE {kind.claimable_sql("t")} AND t.partition_block IS NOT NULL {only}
                          {share.sql("t") if share else ""}
                    ORDER BY {kind.claim_order_sql("t")}
                    LIMIT %(n)s)
                SELECT t.id::text AS id, t.partition_block AS block, t.partition_pos AS pos,
                       COALESCE(t.{kind.col("retry_count")}, 0) AS retries, {select}
                FROM picked t {joins}
                ORDER BY {kind.claim_order_sql("t")}""",
    )


def ready_candidates(
    engine: sa.Engine,
    kind: TaskKind,
    limit: int,
    documents: Sequence[str] | None = None,
    share: BlockShare | None = None,
) -> list[Candidate]:
    """At most `limit` claimable tasks of `kind` with registered partitions, in claim order (priority, failed
    first, oldest); `documents`: of these documents only; `share`: in these registration blocks only."""
    settings, statement = ready_candidates_sql(kind, documents is not None, share)
    level = kind.level
    with engine.begin() as conn:
        for setting in settings:
            conn.exec_driver_sql(setting)
        rows = conn.exec_driver_sql(statement, {"n": limit, "documents": list(documents or ())}).all()
    # the statement's columns are the tuple's, in its order
    return [Candidate._make((*row, level)) for row in rows]


def rows_for_keys(engine: sa.Engine, kind: TaskKind, keys: Sequence[str]) -> dict[str, dict]:
    """Task rows (id, status, worker, retries, error) of the given partition keys; unknown keys are absent."""
    if not keys:
        return {}
    parsed = [parse_partition_key(k) for k in keys]
    # each level finds its parent's id first, by the parent's unique key, and then itself by its own unique key
    # (document_id, page_number) or (page_id, chunk_index): an index probe per key whatever the tables' statistics.
    # A run meets its rows right after they are written, before any ANALYZE; joined as tables instead, the planner
    # may then match a page on its number alone and filter a product of all pages with that number.
    level = kind.level
    document_id = "(SELECT d.id FROM documents d WHERE d.document_key = v.doc)"
    page_id = f"(SELECT p.id FROM task_queue_page p WHERE p.document_id = {document_id} AND p.page_number = v.page)"
    if level is Level.DOCUMENT:
        joins = f"JOIN {kind.table} t ON t.document_key = v.doc"
    elif level is Level.PAGE:
        joins = f"JOIN {kind.table} t ON t.document_id = {document_id} AND t.page_number = v.page"
    else:
        joins = f"JOIN {kind.table} t ON t.page_id = {page_id} AND t.chunk_index = v.chunk"
    with engine.connect() as conn:
        rows = (
            conn.exec_driver_sql(
                f"""SELECT v.key, t.id::text AS id, t.{kind.status}::text AS status,
                       t.{kind.col("worker_id")} AS worker_id, COALESCE(t.{kind.col("retry_count")}, 0) AS retries,
                       t.max_retries, t.{kind.col("error")} AS error, t.{kind.col("error_class")} AS error_class
                FROM unnest(%(keys)s::text[], %(docs)s::text[], %(pages)s::int[], %(chunks)s::int[])
                     AS v(key, doc, page, chunk)
                {joins}""",
                {
                    "keys": list(keys),
                    "docs": [p.document_key for p in parsed],
                    "pages": [p.page_number for p in parsed],
                    "chunks": [p.chunk_index for p in parsed],
                },
            )
            .mappings()
            .all()
        )
    return {r["key"]: dict(r) for r in rows}


def rollup_columns(phase: str | PhaseSpec, phases: PhaseRegistry = PHASES) -> tuple[str, str, str]:
    """A phase's document status, completion time and roll-up time columns."""
    spec = phases.phase(phase)
    return (
        spec.rollup_column(Level.DOCUMENT, "status"),
        spec.rollup_column(Level.DOCUMENT, "completed_at"),
        spec.rollup_column(Level.DOCUMENT, "rollup_at"),
    )


def rollup_candidates(
    engine: sa.Engine,
    phase: str | PhaseSpec,
    limit: int,
    documents: Sequence[str] | None = None,
    share: BlockShare | None = None,
    phases: PhaseRegistry = PHASES,
) -> list[Candidate]:
    """Documents whose phase reached a final status (completed/failed) since their roll-up was last written;
    `documents`: among these only; `share`: in these registration blocks only."""
    columns = "t.id::text AS id, t.partition_block AS block, t.partition_pos AS pos, t.document_key"
    with engine.connect() as conn:
        rows = (
            conn.exec_driver_sql(
                _due_rollups(columns, phase, phases, documents, share), {"n": limit, "documents": list(documents or ())}
            )
            .mappings()
            .all()
        )
    return [
        Candidate(r["id"], int(r["block"]), int(r["pos"]), 0, r["document_key"], None, None, Level.DOCUMENT)
        for r in rows
    ]


class RollupBacklog(NamedTuple):
    """Documents due a phase's roll-up (counted up to the limit asked) and how long the longest-waiting of them has
    waited since its phase reached its final status."""

    documents: int
    oldest_wait_s: float


def rollup_backlog(
    engine: sa.Engine,
    phase: str | PhaseSpec,
    limit: int,
    documents: Sequence[str] | None = None,
    share: BlockShare | None = None,
    phases: PhaseRegistry = PHASES,
) -> RollupBacklog:
    """The backlog `rollup_candidates` would plan from, read through the same partial index and bounded by `limit`."""
    _, completed_at, _ = rollup_columns(phase, phases)
    due = _due_rollups(f"COALESCE(t.{completed_at}, t.updated_at) AS since", phase, phases, documents, share)
    with engine.connect() as conn:
        count, waited = conn.exec_driver_sql(
            f"SELECT count(*), COALESCE(extract(epoch FROM now() - min(w.since)), 0)::float FROM ({due}) w",
            {"n": limit, "documents": list(documents or ())},
        ).one()
    return RollupBacklog(int(count), max(0.0, float(waited)))


def _due_rollups(
    columns: str,
    phase: str | PhaseSpec,
    phases: PhaseRegistry,
    documents: Sequence[str] | None,
    share: BlockShare | None,
) -> str:
    """`columns` of the documents due the phase's roll-up, most urgent first, at most %(n)s of them (among
    %(documents)s when given, in the share's blocks when given): one read of the phase's partial roll-up index."""
    only = ("" if documents is None else "AND t.id = ANY(%(documents)s::uuid[])") + (share.sql("t") if share else "")
    return f"""SELECT {columns} FROM documents t
               WHERE {_waiting_for_rollup(phase, phases)} AND NOT {_known_failure(phase, phases)} {only}
               ORDER BY t.priority DESC, t.updated_at
               LIMIT %(n)s"""


def _waiting_for_rollup(phase: str | PhaseSpec, phases: PhaseRegistry) -> str:
    """The predicate of the phase's partial roll-up index (idx_documents_<phase>_rollup), on alias `t`: a final
    status reached since the roll-up was last written."""
    status, completed_at, rollup_at = rollup_columns(phase, phases)
    return (
        f"t.partition_block IS NOT NULL AND t.{status} IN ('completed', 'failed') "
        f"AND (t.{rollup_at} IS NULL OR t.{rollup_at} < COALESCE(t.{completed_at}, t.updated_at))"
    )


def _known_failure(phase: str | PhaseSpec, phases: PhaseRegistry) -> str:
    """On alias `t`: the phase failed with the very error its last roll-up recorded (nothing new to roll up)."""
    spec = phases.phase(phase)
    status, error = spec.rollup_column(Level.DOCUMENT, "status"), spec.rollup_column(Level.DOCUMENT, "error")
    recorded = spec.rollup_column(Level.DOCUMENT, "rollup_error")
    return f"(t.{status} = 'failed' AND t.{recorded} IS NOT NULL AND t.{recorded} = COALESCE(t.{error}, 'failed'))"


def settle_known_failures(
    engine: sa.Engine, phase: str | PhaseSpec, limit: int, phases: PhaseRegistry = PHASES
) -> list[str]:
    """Mark rolled up, without a run, at most `limit` documents whose phase failed again with the error their last
    roll-up recorded (a retry or a backfill of a file that can never succeed): the failure is on the partition
    already, and a roll-up run would only fail once more. Read through the partial roll-up index, so the cost is
    that of the documents settled. Returns their document keys."""
    _, _, rollup_at = rollup_columns(phase, phases)
    with engine.begin() as conn:
        rows = conn.exec_driver_sql(
            f"""UPDATE documents SET {rollup_at} = now() WHERE id IN (
                    SELECT t.id FROM documents t
                    WHERE {_waiting_for_rollup(phase, phases)} AND {_known_failure(phase, phases)}
                    LIMIT %(n)s)
                RETURNING document_key""",
            {"n": limit},
        ).all()
    return [r[0] for r in rows]


def document_rollup(
    engine: sa.Engine, phase: str | PhaseSpec, document_keys: Sequence[str], phases: PhaseRegistry = PHASES
) -> dict[str, dict]:
    """Per document: its phase status and the figures a roll-up materialization shows (a phase without figures
    of its own: its units of work, completed and failed)."""
    if not document_keys:
        return {}
    spec = phases.phase(phase)
    status, _, _ = rollup_columns(spec, phases)
    leaf = spec.leaf
    unit = "p" if leaf.level is Level.PAGE else "c"
    generic = (
        f"count({unit}.id) AS units, count({unit}.id) FILTER (WHERE {unit}.{leaf.status} = 'completed') "
        f"AS units_completed, count({unit}.id) FILTER (WHERE {unit}.{leaf.status} = 'failed') AS units_failed"
    )
    figures = {
        "ocr": """count(p.id) AS pages, count(p.id) FILTER (WHERE p.ocr_status = 'completed') AS pages_completed,
                  count(p.id) FILTER (WHERE p.ocr_status = 'failed') AS pages_failed,
                  COALESCE(sum(p.ocr_chars), 0) AS characters,
                  count(p.id) FILTER (WHERE p.ocr_method LIKE 'ocr%%') AS pages_ocr,
                  count(p.id) FILTER (WHERE p.ocr_method = 'text-layer') AS pages_text_layer,
                  round(COALESCE(sum(p.ocr_seconds), 0)::numeric, 2)::float AS seconds""",
        "vector": """count(c.id) AS chunks, count(c.id) FILTER (WHERE c.vector_status = 'completed') AS vectors,
                     count(c.id) FILTER (WHERE c.vector_status = 'failed') AS chunks_failed,
                     COALESCE(sum(c.token_count), 0) AS tokens,
                     bool_or(d.extraction_skipped) AS extraction_skipped,
                     (SELECT count(*) FROM task_queue_page sp WHERE sp.document_id = d.id AND sp.embedding_skipped)
                         AS pages_without_text,
                     round(COALESCE(sum(c.vector_seconds), 0)::numeric, 2)::float AS seconds""",
        "graphrag": """count(c.id) AS chunks,
                       count(c.id) FILTER (WHERE c.graphrag_status = 'completed') AS chunks_indexed,
                       count(c.id) FILTER (WHERE c.graphrag_status = 'failed') AS chunks_failed,
                       COALESCE(sum(c.entities_extracted), 0) AS entities,
                       COALESCE(sum(c.relationships_extracted), 0) AS relationships,
                       round(COALESCE(sum(c.graphrag_seconds), 0)::numeric, 2)::float AS seconds""",
    }.get(spec.name, generic)
    source = (
        "LEFT JOIN task_queue_page p ON p.document_id = d.id"
        if leaf.level is Level.PAGE
        else "LEFT JOIN task_queue_chunk c ON c.document_id = d.id"
    )
    error_col = spec.rollup_column(Level.DOCUMENT, "error")
    with engine.connect() as conn:
        rows = (
            conn.exec_driver_sql(
                f"""SELECT d.document_key, d.id::text AS id, d.filename,
                       CASE WHEN {phases.blocked_phase_sql(spec, "d")} THEN 'blocked' ELSE d.{status}::text END
                           AS status, d.{error_col} AS error,
                       {figures}
                FROM documents d {source}
                WHERE d.document_key = ANY(%(keys)s)
                GROUP BY d.id""",
                {"keys": list(document_keys)},
            )
            .mappings()
            .all()
        )
    return {r["document_key"]: dict(r) for r in rows}


def mark_rolled_up(
    engine: sa.Engine, phase: str | PhaseSpec, document_ids: Sequence[str], phases: PhaseRegistry = PHASES
) -> None:
    """Record the roll-up of `document_ids`: its time, and the failure it wrote (NULL when the phase did not fail),
    against which the next failure of the phase is compared (`settle_known_failures`)."""
    spec = phases.phase(phase)
    status, _, rollup_at = rollup_columns(spec, phases)
    error, recorded = spec.rollup_column(Level.DOCUMENT, "error"), spec.rollup_column(Level.DOCUMENT, "rollup_error")
    if document_ids:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"""UPDATE documents SET {rollup_at} = now(),
                        {recorded} = CASE WHEN {status} = 'failed' THEN COALESCE({error}, 'failed') END
                    WHERE id = ANY(%(ids)s::uuid[])""",
                {"ids": list(document_ids)},
            )
