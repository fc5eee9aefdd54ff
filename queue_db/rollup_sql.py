"""SQL generated from the phase specs (queue_db.phases): the bubble-up of a phase's roll-ups, and the columns and
indexes a phase needs. Written once over a phase, so no statement here names a phase.

Bubble-up, the rule (docqueue_status_rule, migration 0002) applied to a parent from its children:
- the parents are locked FOR NO KEY UPDATE in id order, pages before documents, by a statement of their own; the
  recount is the next statement, so under READ COMMITTED it sees every child change committed by whoever held the
  lock before (no lost bubble-up), and one global order (chunks -> pages -> documents, by id) means no deadlocks.
  NO KEY UPDATE still excludes other bubble-ups but not the KEY SHARE lock a foreign-key check takes on a parent;
- a claimed child is `processing`, so by the rule its parent is processing whatever its other children are:
  parents of claimed rows are set without a count; only parents with settled children and no claimed ones are
  recounted, and a level above is recounted only for parents whose status changed;
- one pass for everything a transaction did to one kind (the rows it settled, and the rows it claimed: found by
  worker and heartbeat = now()), so settling a batch and claiming the next locks each parent once.

The statements hand each other their id arrays through transaction-local settings (docqueue.settled,
docqueue.claimed, docqueue.changed), on generic plans (`GENERIC_PLANS`): their parameters are id arrays probed
through primary keys and parent-id indexes, so one plan fits every call, and planning a custom plan per call cost
more than running it. On the hot path (`after_transition`) they run as the body of one generated plpgsql function
per kind (`bubble_function`), called in the same pipelined round trip as the transition: one statement on the
wire instead of five, which is most of the cost when a transaction settles a single task. A volatile function
takes a new snapshot per statement, so each recount still sees what was committed before its lock.
"""

from __future__ import annotations

import functools
import hashlib
import re

from .partition_retention import done_at_sql, live_completed_sql
from .phases import (
    EXPANDED_SQL,
    TABLE_OF_LEVEL,
    Level,
    PhaseRegistry,
    PhaseSpec,
    TaskKind,
    claim_index_name,
    short_table,
)

# a statement that makes the rest of the transaction's statements use generic plans
GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

_SETTLED, _CLAIMED, _CHANGED = "docqueue.settled", "docqueue.claimed", "docqueue.changed"
# a child level's column naming its parent of a level
_PARENT_FK = {
    (Level.CHUNK, Level.PAGE): "page_id",
    (Level.CHUNK, Level.DOCUMENT): "document_id",
    (Level.PAGE, Level.DOCUMENT): "document_id",
}
_CHILD_OF = {Level.DOCUMENT: Level.PAGE, Level.PAGE: Level.CHUNK}
# how a roll-up's error names the child it comes from
_UNALIASED = re.compile(r"\bt\.")
_CHILD_LABEL = {Level.PAGE: ("page", "page_number"), Level.CHUNK: ("chunk", "chunk_index")}


def _ids(setting: str) -> str:
    """A transaction-local id array written by an earlier statement (empty when unset)."""
    return f"COALESCE(NULLIF(current_setting('{setting}', true), ''), '{{}}')::uuid[]"


def child_column(phase: PhaseSpec, level: Level, what: str) -> str:
    """The column of `phase` for `what` (status, error) on `level`'s rows: its task's own where the phase has a
    kind at that level, else its roll-up."""
    kind = phase.kind_at(level)
    return kind.col(what) if kind is not None else phase.rollup_column(level, what)


def _expanded(level: Level, alias: str) -> str:
    return EXPANDED_SQL[level].replace("t.", alias + ".")


def recount_sql(phase: PhaseSpec, level: Level, ids_sql: str) -> str:
    """Recompute the roll-up of `phase` on the `level` parents `ids_sql` (locked before) from their children.
    Returns level, id, old_status, new_status and the parent of each changed row (next_id; NULL for documents)."""
    table, child = TABLE_OF_LEVEL[level], _CHILD_OF[level]
    child_table, fk = TABLE_OF_LEVEL[child], _PARENT_FK[(child, level)]
    status = phase.rollup_column(level, "status")
    started, completed, error = (phase.rollup_column(level, w) for w in ("started_at", "completed_at", "error"))
    child_status, child_error = child_column(phase, child, "status"), child_column(phase, child, "error")
    label, number = _CHILD_LABEL[child]
    rule = (
        f"(SELECT docqueue_status_rule(count(*) FILTER (WHERE c.{child_status} = 'processing'), "
        f"count(*) FILTER (WHERE c.{child_status} = 'pending'), "
        f"count(*) FILTER (WHERE c.{child_status} = 'failed'), count(*)) "
        f"FROM {child_table} c WHERE c.{fk} = p.id)"
    )
    # a page with no chunks is complete; a document with no pages keeps its own status (its expansion's)
    new = f"COALESCE({rule}, 'completed')" if level is Level.PAGE else rule
    next_id = "p.document_id" if level is Level.PAGE else "NULL::uuid"
    return f"""
        WITH computed AS MATERIALIZED (
            SELECT p.id, p.{status} AS old, {new} AS new
            FROM {table} p WHERE p.id = ANY({ids_sql}) AND {_expanded(level, "p")}
        )
        UPDATE {table} p
        SET {status} = computed.new,
            {started} = COALESCE(p.{started}, CASE WHEN computed.new = 'processing' THEN now() END),
            {completed} = CASE WHEN computed.new = 'completed' THEN now() END,
            {error} = CASE WHEN computed.new = 'failed' THEN (
                    SELECT '{label} ' || c.{number} || ': ' || c.{child_error} FROM {child_table} c
                    WHERE c.{fk} = p.id AND c.{child_status} = 'failed' ORDER BY c.{number} LIMIT 1)
                ELSE p.{error} END,
            updated_at = now()
        FROM computed
        WHERE p.id = computed.id AND computed.new IS NOT NULL AND p.{status} IS DISTINCT FROM computed.new
        RETURNING '{level.value}'::text AS level, p.id, computed.old AS old_status, computed.new AS new_status,
                  {next_id} AS next_id"""


def _processing_sql(phase: PhaseSpec, level: Level, ids_sql: str) -> str:
    """Parents of claimed children become processing, without a count (the rule's first case)."""
    table = TABLE_OF_LEVEL[level]
    status, started, completed = (phase.rollup_column(level, w) for w in ("status", "started_at", "completed_at"))
    next_id = "p.document_id" if level is Level.PAGE else "NULL::uuid"
    return f"""
        UPDATE {table} p SET {status} = 'processing', {started} = COALESCE(p.{started}, now()),
                             {completed} = NULL, updated_at = now()
        WHERE p.id = ANY({ids_sql}) AND {_expanded(level, "p")} AND p.{status} IS DISTINCT FROM 'processing'
        RETURNING {next_id} AS next_id"""


def lock_sql(level: Level, ids_sql: str) -> str:
    """Lock parents of `level` in id order (the statement before their recount)."""
    return (
        f"SELECT p.id FROM {TABLE_OF_LEVEL[level]} p WHERE p.id = ANY({ids_sql}) ORDER BY p.id FOR NO KEY UPDATE OF p"
    )


def _collect_and_lock(kind: TaskKind, level: Level) -> str:
    """The first statement after a transition of `kind` (%(worker)s, %(ids)s: the rows it settled): the parents
    of `level` of the rows settled and of the rows claimed, locked in id order, and remembered for the next one."""
    fk = _PARENT_FK[(kind.level, level)]
    claimed_where = (
        f"t.{kind.status} = 'processing' AND ({kind.owns('t')}) "
        f"AND t.{kind.col('last_heartbeat')} = now() AND t.{kind.col('worker_id')} = %(worker)s"
    )
    return f"""
        WITH settled AS (
            SELECT COALESCE(array_agg(DISTINCT t.{fk}), '{{}}') AS ids FROM {kind.table} t
            WHERE t.id = ANY(%(ids)s::uuid[])),
        claimed AS (
            SELECT COALESCE(array_agg(DISTINCT t.{fk}), '{{}}') AS ids FROM {kind.table} t WHERE {claimed_where}),
        locked AS (
            SELECT p.id FROM {TABLE_OF_LEVEL[level]} p, settled, claimed WHERE p.id = ANY(settled.ids || claimed.ids)
            ORDER BY p.id FOR NO KEY UPDATE OF p)
        SELECT set_config('{_CLAIMED}', claimed.ids::text, true),
               set_config('{_SETTLED}', ARRAY(SELECT DISTINCT s FROM unnest(settled.ids) s
                                              WHERE NOT (s = ANY(claimed.ids)))::text, true),
               (SELECT count(*) FROM locked) AS locked
        FROM settled, claimed"""


def _lock_changed(level: Level) -> str:
    """Lock the parents of `level` whose child changed at the level below; they are recounted (none claimed)."""
    return f"""
        WITH locked AS ({lock_sql(level, _ids(_CHANGED))})
        SELECT set_config('{_CLAIMED}', '{{}}', true), set_config('{_SETTLED}', {_ids(_CHANGED)}::text, true),
               (SELECT count(*) FROM locked) AS locked"""


def _update_level(phase: PhaseSpec, level: Level) -> str:
    """Claimed parents become processing, settled ones are recounted; the parents above the changed ones are
    remembered for the next level."""
    return f"""
        WITH claimed AS ({_processing_sql(phase, level, _ids(_CLAIMED))}),
        recounted AS ({recount_sql(phase, level, _ids(_SETTLED))})
        SELECT set_config('{_CHANGED}', COALESCE(array_agg(DISTINCT x.next_id)
                                                    FILTER (WHERE x.next_id IS NOT NULL), '{{}}')::text, true)
        FROM (SELECT next_id FROM claimed UNION ALL SELECT next_id FROM recounted) x"""


def bubble_statements(kind: TaskKind) -> tuple[str, ...]:
    """The statements that bubble a transition of `kind` up (%(worker)s: its worker, %(ids)s: the rows it settled),
    in order; empty for a document's own task (its expansion writes the document's status itself). The hot path
    runs them as the body of the kind's generated function (bubble_function); the plan tests run them one by one."""
    levels = [level for level in kind.parent_levels if level in kind.phase.rollup_levels]
    if not levels:
        return ()
    statements = [GENERIC_PLANS, _collect_and_lock(kind, levels[0]), _update_level(kind.phase, levels[0])]
    for level in levels[1:]:
        statements += [_lock_changed(level), _update_level(kind.phase, level)]
    return tuple(statements)


@functools.cache  # the hot path asks on every transition; a kind's function never changes within a process
def bubble_function(kind: TaskKind) -> tuple[str, str] | None:
    """(name, CREATE statement) of the plpgsql function that runs bubble_statements(kind) in one call: one
    statement on the wire per transition instead of five. Its name carries a hash of its body, so a process only
    ever calls the body it generated; `docqueue db upgrade` creates the functions of the current specs."""
    statements = bubble_statements(kind)
    if not statements:
        return None
    lines = [
        f"    {sql.strip()} INTO r;" if sql.lstrip().startswith(("WITH", "SELECT")) else f"    {sql.strip()};"
        for sql in statements
    ]
    body = (
        "\nDECLARE r record;\nBEGIN\n"
        + "\n".join(line.replace("%(worker)s", "p_worker").replace("%(ids)s", "p_ids") for line in lines)
        + "\nEND\n"
    )
    name = f"docqueue_after_{kind.name}_{hashlib.sha256(body.encode()).hexdigest()[:10]}"
    return name, (
        f"CREATE OR REPLACE FUNCTION {name}(p_worker text, p_ids uuid[]) RETURNS void "
        f"LANGUAGE plpgsql AS $body${body}$body$"
    )


def after_transition(kind: TaskKind) -> tuple[str, ...]:
    """What the hot path sends after a transition of `kind`, in its pipelined round trip: one call of the kind's
    bubble-up function (%(worker)s, %(ids)s), or nothing for a document's own task."""
    function = bubble_function(kind)
    return () if function is None else (f"SELECT {function[0]}(%(worker)s, %(ids)s::uuid[])",)


def phase_ddl(phases: PhaseRegistry) -> list[tuple[str, str, str]]:
    """(kind, name, statement) of every column (kind 'column', name 'table.column'), index (kind 'index') and
    bubble-up function (kind 'function') the phases need, each statement idempotent. The existing phases' columns
    and indexes come from the migrations under these very names, so for them the statements change nothing; the
    functions are named by their body's hash, so one that exists is the one wanted."""
    ddl: list[tuple[str, str, str]] = []

    def column(table: str, name: str, sql_type: str) -> None:
        ddl.append(("column", f"{table}.{name}", f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {sql_type}"))

    def index(name: str, statement: str) -> None:
        ddl.append(("index", name, f"CREATE INDEX IF NOT EXISTS {name} ON {statement}"))

    status_type = "task_status NOT NULL DEFAULT 'pending'"
    for phase in phases:
        for kind in phase.kinds:
            for what, sql_type in (
                ("status", status_type),
                ("worker_id", "varchar(100)"),
                ("started_at", "timestamptz"),
                ("completed_at", "timestamptz"),
                ("error", "text"),
                ("error_class", "varchar(32)"),
                ("retry_count", "integer DEFAULT 0"),
                ("last_heartbeat", "timestamptz"),
                ("next_attempt_at", "timestamptz"),
                ("failed_at", "timestamptz"),
            ):
                column(kind.table, kind.col(what), sql_type)
            for name, sql_type in kind.result_columns.items():
                column(kind.table, name, sql_type)
        for level in phase.rollup_levels:
            table = TABLE_OF_LEVEL[level]
            column(table, phase.rollup_column(level, "status"), status_type)
            for what, sql_type in (("started_at", "timestamptz"), ("completed_at", "timestamptz"), ("error", "text")):
                column(table, phase.rollup_column(level, what), sql_type)
        column("documents", phase.rollup_column(Level.DOCUMENT, "rollup_at"), "timestamptz")
        column("documents", phase.rollup_column(Level.DOCUMENT, "rollup_error"), "text")
        for kind in phase.kinds:
            status, retries = kind.status, kind.col("retry_count")
            gate = kind.claim_gate_sql()
            claimable = (
                f"({status} = 'pending' OR ({status} = 'failed' AND {retries} < "
                f"{_UNALIASED.sub('', kind.max_retries_sql('t'))}))"
            )
            where = claimable if gate == "TRUE" else f"({_UNALIASED.sub('', gate)}) AND {claimable}"
            key = ", ".join(f"({c})" if c.startswith(("-", "CASE")) else c for c in kind.claim_key("t"))
            index(claim_index_name(kind), f"{kind.table} ({_UNALIASED.sub('', key)}) WHERE {where}")
            short = short_table(kind.table)
            # the few open tasks that carry an error class (`docqueue stats`); a row without one has no entry
            error_class = kind.col("error_class")
            index(
                f"idx_{short}_{kind.prefix}_error_class",
                f"{kind.table} ({error_class}) WHERE {error_class} IS NOT NULL",
            )
            if kind.level is not Level.DOCUMENT:  # a document's own task has idx_documents_heartbeat
                index(
                    f"idx_{short}_{kind.prefix}_heartbeat",
                    f"{kind.table} ({kind.col('last_heartbeat')}) WHERE {status} = 'processing'",
                )
                index(f"idx_{short}_{kind.prefix}_status", f"{kind.table} ({status}) WHERE {status} = 'failed'")
        status, completed, rollup_at = (
            phase.rollup_column(Level.DOCUMENT, w) for w in ("status", "completed_at", "rollup_at")
        )
        index(
            f"idx_documents_{phase.column_prefix}_rollup",
            f"documents (priority DESC, updated_at) WHERE partition_block IS NOT NULL "
            f"AND {status} IN ('completed', 'failed') "
            f"AND ({rollup_at} IS NULL OR {rollup_at} < COALESCE({completed}, updated_at))",
        )
    return ddl + [("function", *function) for kind in phases.kinds if (function := bubble_function(kind))]


def retention_ddl(phases: PhaseRegistry) -> list[tuple[str, str, str, list[str]]]:
    """Per page and chunk level, what partition retention needs to follow the phases: the partial index of live
    completed rows (idx_*_retirable, over when the last phase completed) and the trigger that registers a retired
    partition again once any phase of its row leaves `completed` (trg_*_unretire). Each is (kind, name, marker,
    statements): the marker, the phases in order, is kept as the object's comment, so the statements run only when
    the phases changed (the three phases' objects come from migrations 0020, 0023 and 0027)."""
    ddl = []
    for level in (Level.PAGE, Level.CHUNK):
        table, short = TABLE_OF_LEVEL[level], short_table(TABLE_OF_LEVEL[level])
        columns = phases.level_columns(level)
        marker = "phases: " + ",".join(status.rsplit("_status", 1)[0] for status, _ in columns)
        # the retire queries' own rule, unaliased: the index is exactly what they read
        done_at = _UNALIASED.sub("", done_at_sql(level, phases))
        live = _UNALIASED.sub("", live_completed_sql(level, phases))
        index, trigger = f"idx_{short}_retirable", f"trg_{short}_unretire"
        ddl.append(
            (
                "index",
                index,
                marker,
                [
                    f"DROP INDEX IF EXISTS {index}",
                    f"CREATE INDEX {index} ON {table} ({done_at}) WHERE {live}",
                    f"COMMENT ON INDEX {index} IS '{marker}'",
                ],
            )
        )
        left = " OR ".join(f"NEW.{status} <> 'completed'" for status, _ in columns)
        ddl.append(
            (
                "trigger",
                f"{table}.{trigger}",
                marker,
                [
                    # after, not before: a BEFORE ROW trigger locks (and WAL-logs) every row it may touch
                    f"CREATE OR REPLACE TRIGGER {trigger} AFTER UPDATE ON {table} FOR EACH ROW "
                    f"WHEN (NEW.partition_retired_at IS NOT NULL AND ({left})) "
                    "EXECUTE FUNCTION docqueue_unretire_partition_after()",
                    f"COMMENT ON TRIGGER {trigger} ON {table} IS '{marker}'",
                ],
            )
        )
    return ddl


def missing_phase_ddl(conn, phases: PhaseRegistry) -> list[str]:
    """The statements of phase_ddl whose column or index does not exist yet, and of retention_ddl whose object
    was made for other phases: taking a table's lock for a no-op ADD COLUMN IF NOT EXISTS on every start would
    queue behind (and block) the workers' transactions."""
    columns = {
        f"{t}.{c}"
        for t, c in conn.exec_driver_sql(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        )
    }
    indexes = {
        r[0] for r in conn.exec_driver_sql("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    }
    absent = set(missing_bubble_functions(conn, phases))
    retention = retention_ddl(phases)
    marked = dict(
        conn.exec_driver_sql(
            """SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c
           WHERE c.relkind = 'i' AND c.relname = ANY(%(names)s)
           UNION ALL
           SELECT r.relname || '.' || t.tgname, obj_description(t.oid, 'pg_trigger') FROM pg_trigger t
           JOIN pg_class r ON r.oid = t.tgrelid WHERE r.relname || '.' || t.tgname = ANY(%(names)s)""",
            {"names": [name for _kind, name, _marker, _ddl in retention]},
        ).all()
    )
    statements = [
        statement
        for kind, name, statement in phase_ddl(phases)
        if (name in absent if kind == "function" else name not in (columns if kind == "column" else indexes))
    ]
    for _kind, name, marker, ddl in retention:
        if marked.get(name) != marker:
            statements += ddl
    return statements


def missing_bubble_functions(conn, phases: PhaseRegistry) -> list[str]:
    """The bubble-up functions of these specs that the database lacks (it was upgraded by another version of the
    code): a queue refuses to start rather than fail on its first transition."""
    wanted = [function[0] for kind in phases.kinds if (function := bubble_function(kind))]
    present = {
        r[0] for r in conn.exec_driver_sql("SELECT proname FROM pg_proc WHERE proname = ANY(%(n)s)", {"n": wanted})
    }
    return [name for name in wanted if name not in present]
