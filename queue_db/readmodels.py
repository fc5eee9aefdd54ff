"""The seed's read models ("Example Queries"): rows (lists of dicts) for the CLI, pandas DataFrames for notebooks
and tests. pandas is imported only by the DataFrame forms: `docqueue status` and `stats` start without it.

Every whole-corpus view reads a bounded set, whatever the history holds: status one page of documents through
idx_documents_listing; the counts only the tasks not completed, through the partial status and heartbeat indexes,
with the completed ones as the total (an index-only count) less those; the timings a sample of about
DOCQUEUE_STATS_WINDOW completed tasks per type."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .config import QueueConfig, default
from .near_duplicates import copies_of
from .phases import PHASES, Level, PhaseRegistry, PhaseSpec, TaskKind
from .run_scope import among_documents, document_parameters

if TYPE_CHECKING:
    import pandas as pd
    import sqlalchemy as sa


def _progress_sql(phases: PhaseRegistry) -> str:
    """The status listing's query, from the phase specs: per phase its document status and roll-up error, the
    completed and failed tasks of its deepest kind (`<prefix>_completed_pages`, `<prefix>_failed_chunks`, ...),
    and whether it waits on a task failed for good; `{where}` and `{limit}` pick the page of documents.

    A document's pages and chunks are each read once, in a LATERAL through idx_tqp_document and idx_tqc_document,
    whatever the statistics say: with a condition on a status, the planner took a partial index of completed
    vectors while its statistics counted none, and filtered 35,000 rows per document."""
    kinds = phases.kinds
    # per level, the counts of the phases whose deepest kind is there: (column name, aggregate over alias x)
    counted: dict[Level, list[tuple[str, str]]] = {Level.PAGE: [], Level.CHUNK: []}
    for phase in phases:
        leaf = phase.leaf
        if leaf.level in counted:
            counted[leaf.level] += [
                (
                    f"{phase.column_prefix}_{outcome}_{leaf.level.value}s",
                    f"COUNT(*) FILTER (WHERE x.{leaf.status} = '{outcome}')",
                )
                for outcome in ("completed", "failed")
            ]
    aggregates = {}
    for level, columns in counted.items():
        failed = [f"x.{k.col('failed_at')}" for k in kinds if k.level is level]
        aggregates[level] = ", ".join(
            [
                *(f"{expr} AS {name}" for name, expr in columns),
                f"MAX(GREATEST({', '.join(failed)})) AS failed_at" if failed else "NULL::timestamptz AS failed_at",
            ]
        )
    statuses = ", ".join(f"d.{phase.rollup_column(Level.DOCUMENT, 'status')}" for phase in phases)
    counts = ", ".join(
        f"{'p' if level is Level.PAGE else 'c'}.{name}" for level, columns in counted.items() for name, _ in columns
    )
    errors = ", ".join(f"d.{phase.rollup_column(Level.DOCUMENT, 'error')}" for phase in phases)
    document_kinds = [k for k in kinds if k.level is Level.DOCUMENT]
    classes = [f"d.{k.col('error_class')}" for k in document_kinds]
    error_class = f"COALESCE({', '.join(classes)})" if classes else "NULL::varchar"
    last_failed = ", ".join([*(f"d.{k.col('failed_at')}" for k in document_kinds), "p.failed_at", "c.failed_at"])
    blocked = ", ".join(
        f"CASE WHEN {phases.blocked_phase_sql(phase, 'd')} THEN '{phase.value}' END" for phase in phases
    )
    return f"""
SELECT d.id, d.document_key, d.tenant_id, d.filename, d.priority, {statuses},
       COALESCE(d.page_count, 0) AS page_count, p.total_pages, p.total_chunks, {counts},
       -- phases skipped on purpose: pages with no text to embed; text not extracted again for a re-index
       p.pages_without_text, d.extraction_skipped, {errors},
       -- what read a PDF's pages: pymupdf, or pdfium when PyMuPDF found none (NULL for text and office files)
       d.metadata->>'engine' AS engine,
       -- when any task of the document last failed (GREATEST skips NULLs)
       GREATEST({last_failed}) AS last_failed_at, {error_class} AS error_class,
       -- phases that wait on a task failed for good: a derived view, the stored status stays pending
       ARRAY_REMOVE(ARRAY[{blocked}], NULL) AS blocked_phases
FROM (SELECT * FROM documents {{where}} ORDER BY created_at, id {{limit}}) d
CROSS JOIN LATERAL (
    SELECT COUNT(*) AS total_pages, COALESCE(SUM(x.chunk_count), 0) AS total_chunks,
           COUNT(*) FILTER (WHERE x.embedding_skipped) AS pages_without_text, {aggregates[Level.PAGE]}
    FROM task_queue_page x WHERE x.document_id = d.id) p
CROSS JOIN LATERAL (
    SELECT {aggregates[Level.CHUNK]}
    FROM task_queue_chunk x WHERE x.document_id = d.id) c
ORDER BY d.created_at, d.id
"""


def _in_tenant(kind: TaskKind, tenant: str | None) -> str:
    """`AND` the row belongs to a document of %(tenant)s (nothing without a tenant)."""
    if tenant is None:
        return ""
    if kind.level is Level.DOCUMENT:
        return " AND t.tenant_id = %(tenant)s"
    return f" AND t.{kind.document_column} IN (SELECT id FROM documents WHERE tenant_id = %(tenant)s)"


def _open_task_conditions(k: TaskKind) -> list[str]:
    """Conditions over alias t that together select the kind's open tasks (not completed), each once, each implying
    the predicate of a partial index: processing (the heartbeat index), failed (the failed-rows index), pending
    behind an open gate (the claim index), and pending behind a closed one, by the open status of the same-row task
    the gate waits for (that task's own indexes). Read as `status IN ('pending', 'failed')`, no index covers the
    pending rows, and every count scanned the whole table, however few tasks were open."""
    own = f"({k.owns('t')})"
    conditions = [f"t.{k.status} = 'processing' AND {own}", f"t.{k.status} = 'failed' AND {own}"]
    pending, gate = f"t.{k.status} = 'pending' AND {own}", k.claim_gate_sql("t")
    if gate == "TRUE" or k.depends_on is None:
        return [*conditions, pending]
    # the gate is the completion of the same row's task the kind depends on (TaskKind.depends_on): a pending task
    # behind a closed gate waits on a task that is itself open
    waiting = [f"{pending} AND NOT ({gate}) AND {c}" for c in _open_task_conditions(k.depends_on)]
    return [*conditions, f"{pending} AND {gate}", *waiting]


def _open_counts_sql(tenant: str | None = None, phases: PhaseRegistry = PHASES) -> str:
    """Per kind: the open tasks by status (blocked apart), a branch per partial index (_open_task_conditions)."""
    branches: list[str] = []
    for k in phases.kinds:
        status = f"CASE WHEN {k.blocked_sql('t')} THEN 'blocked' ELSE t.{k.status}::text END"
        branches += [
            f"SELECT '{k.label}' AS task_type, {status} AS status, COUNT(*) AS count FROM {k.table} t "
            f"WHERE {condition}{_in_tenant(k, tenant)} GROUP BY 2"
            for condition in _open_task_conditions(k)
        ]
    return "\nUNION ALL ".join(branches)


def _statistics_sql(tenant: str | None = None, phases: PhaseRegistry = PHASES) -> str:
    """The open tasks' counts (_open_counts_sql) and, per table and ownership rule, the total the completed ones
    are derived from, counted once for the kinds sharing it (both chunk kinds own every chunk row). With a tenant,
    the total is that tenant's rows (through the document id indexes): linear in the tenant's size."""
    totals: dict[tuple[str, str], list[str]] = {}
    for k in phases.kinds:
        totals.setdefault((k.table, f"({k.owns('t')}){_in_tenant(k, tenant)}"), []).append(k.label)
    counted = [
        f"SELECT '{','.join(labels)}', 'total', COUNT(*) FROM {table} t WHERE {owns}"
        for (table, owns), labels in totals.items()
    ]
    return "\nUNION ALL ".join([_open_counts_sql(tenant, phases), *counted])


def _timings_sql(k: TaskKind, percent: float | None, window: int, tenant: str | None = None) -> str:
    """Queue wait = claim - ready (the dependency's completion); run = completion - claim; completed tasks only,
    at most `window` of them, from a sample of `percent` of the table's blocks (None: the whole table)."""
    sample = f" TABLESAMPLE SYSTEM ({percent:.6f})" if percent is not None else ""
    return f"""
WITH samples AS (
    SELECT EXTRACT(EPOCH FROM t.{k.col("started_at")} - {k.ready_since_sql}) AS wait_s,
           EXTRACT(EPOCH FROM t.{k.col("completed_at")} - t.{k.col("started_at")}) AS run_s
    FROM {k.table} t{sample}
    WHERE (t.{k.status} = 'completed' OR NOT ({k.owns("t")}))
      AND t.{k.col("completed_at")} IS NOT NULL AND t.{k.col("started_at")} IS NOT NULL{_in_tenant(k, tenant)}
    LIMIT {int(window)}
)
SELECT '{k.label}' AS task_type, COUNT(*) AS completed, {"TRUE" if sample else "FALSE"} AS sampled,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS wait_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS wait_p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY run_s) AS run_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY run_s) AS run_p95_s
FROM samples HAVING COUNT(*) > 0
"""


def _error_classes_sql(tenant: str | None = None, phases: PhaseRegistry = PHASES) -> str:
    """Completion clears a task's error class, so only open tasks carry one; each kind's are read through its
    index of the rows that carry one (migration 0034)."""
    branches = []
    for k in phases.kinds:
        error_class = f"t.{k.col('error_class')}"
        branches.append(
            f"SELECT '{k.label}' AS task_type, {error_class} AS error_class, COUNT(*) AS count FROM {k.table} t "
            f"WHERE t.{k.status} <> 'completed' AND ({k.owns('t')}) AND {error_class} IS NOT NULL"
            f"{_in_tenant(k, tenant)} GROUP BY 2"
        )
    return "\nUNION ALL ".join(branches) + "\nORDER BY 1, 2"


def phase_progress(
    engine: sa.Engine, phases: PhaseRegistry = PHASES, documents: Sequence[str] | None = None
) -> dict[str, dict[str, int]]:
    """Per phase, its units of work (the phase's deepest kind): total, completed, failed; of every document, or
    only of `documents` (ids), read through each table's document index."""
    sql = "\nUNION ALL ".join(
        f"SELECT '{phase.value}', count(*), count(*) FILTER (WHERE t.{k.status} = 'completed'), "
        f"count(*) FILTER (WHERE t.{k.status} = 'failed') "
        f"FROM {k.table} t{among_documents(k.document_column, documents is not None)}"
        for phase in phases
        for k in (phase.leaf,)
    )
    params = document_parameters(documents)
    with engine.connect() as conn:
        return {
            r[0]: {"total": int(r[1]), "completed": int(r[2]), "failed": int(r[3])}
            for r in conn.exec_driver_sql(sql, *params).all()
        }


def _rows(engine: sa.Engine, sql: str, params: dict | None = None) -> tuple[list[dict], list[str]]:
    with engine.connect() as conn:
        result = conn.exec_driver_sql(sql, params or {})
        return [dict(r) for r in result.mappings().all()], list(result.keys())


def _frame(rows: list[dict], columns: list[str]) -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


def document_progress_rows(
    engine: sa.Engine,
    document_id: str | None = None,
    *,
    limit: int | None = None,
    after_key: str | None = None,
    tenant: str | None = None,
    phases: PhaseRegistry = PHASES,
) -> list[dict]:
    """Per document: each phase's status, error and completed/failed tasks of its deepest kind; pages, chunks.
    In registration order; `limit` documents after the one keyed `after_key` (a page of a long listing, read
    through idx_documents_listing, or idx_documents_tenant_listing for one `tenant`, so every page costs the
    same)."""
    return _document_progress_query(engine, document_id, limit, after_key, tenant, phases)[0]


def _document_progress_query(
    engine: sa.Engine,
    document_id: str | None,
    limit: int | None,
    after_key: str | None,
    tenant: str | None = None,
    phases: PhaseRegistry = PHASES,
) -> tuple[list[dict], list[str]]:
    clauses, params = [], {"tenant": tenant}
    if document_id is not None:
        clauses.append("id = %(id)s")
        params["id"] = str(document_id)
    elif after_key is not None:
        clauses.append("(created_at, id) > (SELECT created_at, id FROM documents WHERE document_key = %(after)s)")
        params["after"] = after_key
    if tenant is not None:
        clauses.append("tenant_id = %(tenant)s")
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    sql = _progress_sql(phases).format(where=where, limit=f"LIMIT {int(limit)}" if limit else "")
    return _document_progress(engine, sql, params)


def _document_progress(engine: sa.Engine, sql: str, params: dict) -> tuple[list[dict], list[str]]:
    rows, columns = _rows(engine, sql, params)
    groups = content_groups(engine, [str(row["id"]) for row in rows])
    for row in rows:
        row["content_group"] = groups.get(str(row["id"]))
        row["id"] = str(row["id"])
        # SUM over integers comes back as Decimal: JSON wants a number
        row["total_chunks"] = int(row["total_chunks"])
        failed_at = row["last_failed_at"]
        row["last_failed_at"] = None if failed_at is None else failed_at.isoformat(timespec="seconds")
    return rows, columns


def content_groups(engine: sa.Engine, document_ids: list[str]) -> dict[str, dict]:
    """Per listed document in a content group: its representative, the similarity it joined with, and its copies
    (how many, and the first keys); one query for the page of documents."""
    return {
        document_id: {
            "representative": group["representative"],
            "similarity": group["similarity"],
            "copies": group["count"],
            "keys": group["keys"],
        }
        for document_id, group in copies_of(engine, document_ids).items()
    }


def document_progress(
    engine: sa.Engine,
    document_id: str | None = None,
    *,
    limit: int | None = None,
    after_key: str | None = None,
    tenant: str | None = None,
) -> "pd.DataFrame":
    rows, columns = _document_progress_query(engine, document_id, limit, after_key, tenant)
    return _frame(rows, [*columns, "content_group"])


def queue_statistics_rows(engine: sa.Engine, tenant: str | None = None, phases: PhaseRegistry = PHASES) -> list[dict]:
    """task_type x status x count over every kind (the seed's query, plus documents and pages whose status is
    still their own), sorted by type and status; of one tenant's documents when `tenant` is given."""
    rows, _ = _rows(engine, _statistics_sql(tenant, phases), {"tenant": tenant})
    counts: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for row in rows:
        if row["status"] == "total":
            totals.update((label, int(row["count"])) for label in row["task_type"].split(","))
        else:  # a status may come from several branches (_open_task_conditions)
            key = (row["task_type"], row["status"])
            counts[key] = counts.get(key, 0) + int(row["count"])
    for task_type, total in totals.items():
        completed = total - sum(n for (t, _), n in counts.items() if t == task_type)
        if completed > 0:
            counts[(task_type, "completed")] = completed
    return [{"task_type": t, "status": s, "count": n} for (t, s), n in sorted(counts.items())]


def queue_statistics(engine: sa.Engine, tenant: str | None = None) -> "pd.DataFrame":
    return _frame(queue_statistics_rows(engine, tenant), ["task_type", "status", "count"])


def phase_timings_rows(
    engine: sa.Engine, window: int | None = None, tenant: str | None = None, phases: PhaseRegistry = PHASES
) -> list[dict]:
    """Queue wait and processing time (median, p95) per task type, over at most `window` completed tasks of each
    (DOCQUEUE_STATS_WINDOW, which the entry point hands in; None: its default): all of them while a table holds
    fewer rows, beyond that those of a random sample of the table's blocks sized to hold about `window` rows, so the
    cost stays flat however long the history."""
    if window is None:
        window = default(QueueConfig, "stats_window")
    tables = sorted({k.table for k in phases.kinds})
    with engine.connect() as conn:
        # the planner's row estimate, kept by autovacuum's ANALYZE: -1 for a table never analyzed (a new, small one)
        estimates: dict[str, float] = dict(
            conn.exec_driver_sql(
                "SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%(t)s) AND relkind = 'r'", {"t": tables}
            ).all()
        )
    rows: list[dict] = []
    for k in phases.kinds:
        estimate = float(estimates.get(k.table) or -1)
        # one tenant's rows may be too few for a block sample to find: they are read up to the window instead
        percent = 100.0 * window / estimate if estimate > window and tenant is None else None
        found, _ = _rows(engine, _timings_sql(k, percent, window, tenant), {"tenant": tenant})
        rows.extend(found)
    return rows


def phase_timings(engine: sa.Engine, window: int | None = None, tenant: str | None = None) -> "pd.DataFrame":
    return _frame(
        phase_timings_rows(engine, window, tenant),
        ["task_type", "completed", "sampled", "wait_median_s", "wait_p95_s", "run_median_s", "run_p95_s"],
    )


def error_classes_rows(engine: sa.Engine, tenant: str | None = None, phases: PhaseRegistry = PHASES) -> list[dict]:
    """task_type x error_class x count, over the tasks not completed (completion clears the class)."""
    rows, _ = _rows(engine, _error_classes_sql(tenant, phases), {"tenant": tenant})
    return [{**r, "count": int(r["count"])} for r in rows]


def error_classes(engine: sa.Engine, tenant: str | None = None) -> "pd.DataFrame":
    return _frame(error_classes_rows(engine, tenant), ["task_type", "error_class", "count"])


def documents_ready(engine: sa.Engine, phase: PhaseSpec, phases: PhaseRegistry = PHASES) -> "pd.DataFrame":
    """Documents whose previous phase completed and whose `phase` has not started (the seed's query)."""
    previous = phases.previous(phase)
    if previous is None:
        sql = f"SELECT id, filename FROM documents WHERE {phase.document_status_column} = 'pending' ORDER BY created_at"
    else:
        sql = (
            f"SELECT id, filename FROM documents WHERE {previous.document_status_column} = 'completed' "
            f"AND {phase.document_status_column} = 'pending' ORDER BY created_at"
        )
    rows, columns = _rows(engine, sql)
    return _frame([{**r, "id": str(r["id"])} for r in rows], columns)
