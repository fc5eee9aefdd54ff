"""Which page and chunk partitions may leave Dagster, and the mark that says they left (no Dagster here).

A page or chunk whose phases all completed is retirable once it completed more than the retention ago, or once
more than `max_completed` newer completed ones are live. Failed and pending tasks are never retirable, so they
stay backfillable. The rule is generated from the phase specs, and so are the partial indexes idx_tqp_retirable /
idx_tqc_retirable it reads (rollup_sql.phase_ddl), through which rows are found oldest first, a batch at a time.
The queue rows keep their whole history. A retired task put back to work gets its partition again: the generated
trg_*_unretire trigger clears its block when any phase of its row leaves `completed`, and the sensors register
its key anew.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .partition_keys import _KEY_SELECT, TABLE, key_of
from .phases import PHASES, Level, PhaseRegistry

if TYPE_CHECKING:
    import sqlalchemy as sa


def done_at_sql(level: Level, phases: PhaseRegistry = PHASES) -> str:
    """When a row's last phase completed: the expression of its level's idx_*_retirable (rollup_sql.phase_ddl)."""
    return f"GREATEST({', '.join(f't.{completed}' for _, completed in phases.level_columns(level))})"


def live_completed_sql(level: Level, phases: PhaseRegistry = PHASES) -> str:
    """A row whose phases all completed and whose partition is live: its level's idx_*_retirable predicate."""
    done = " AND ".join(f"t.{status} = 'completed'" for status, _ in phases.level_columns(level))
    return f"{done} AND t.partition_block IS NOT NULL AND t.partition_retired_at IS NULL"


RETIRABLE_LEVELS = (Level.PAGE, Level.CHUNK)


def retire_before(
    conn: sa.Connection, level: Level, retention_s: float, max_completed: int, phases: PhaseRegistry = PHASES
) -> datetime:
    """The completion time before which a live completed partition of `level` is retired: the retention's
    cut-off, or later when more than `max_completed` completed partitions are live (reads at most
    max_completed + 1 index entries). The retention is counted on the database's clock, the one that stamped the
    completions: a recovery job on a machine whose clock runs ahead would otherwise retire partitions early."""
    cutoff = conn.exec_driver_sql("SELECT now() - make_interval(secs => %(s)s)", {"s": float(retention_s)}).scalar_one()
    done_at = done_at_sql(level, phases)
    beyond_max = conn.exec_driver_sql(
        f"""SELECT {done_at} FROM {TABLE[level]} t WHERE {live_completed_sql(level, phases)}
            ORDER BY {done_at} DESC OFFSET %(n)s LIMIT 1""",
        {"n": max_completed},
    ).scalar()
    if beyond_max is not None:
        # the (max_completed + 1)-th newest goes, with everything older
        cutoff = max(cutoff, beyond_max + timedelta(microseconds=1))
    return cutoff


def retire_batch(
    engine: sa.Engine,
    level: Level,
    retention_s: float,
    max_completed: int,
    batch: int,
    delete_keys: Callable[[Sequence[str]], None],
    phases: PhaseRegistry = PHASES,
) -> int:
    """Retire up to `batch` partitions of `level`, oldest first: mark the rows, call `delete_keys` with their
    partition keys, and commit the marks only once the keys are gone. The marked rows stay locked until then,
    so a task put back to work meanwhile waits, and then finds its row retired and has its partition registered
    again. Returns how many partitions were retired."""
    select, joins = _KEY_SELECT[level]
    done_at = done_at_sql(level, phases)
    with engine.begin() as conn:
        before = retire_before(conn, level, retention_s, max_completed, phases)
        rows = (
            conn.exec_driver_sql(
                f"""WITH due AS (
                    SELECT t.id FROM {TABLE[level]} t
                    WHERE {live_completed_sql(level, phases)} AND {done_at} < %(before)s
                    ORDER BY {done_at} LIMIT %(n)s
                    FOR NO KEY UPDATE SKIP LOCKED),
                marked AS (
                    UPDATE {TABLE[level]} t SET partition_retired_at = now()
                    FROM due WHERE t.id = due.id
                    RETURNING t.*)
                SELECT {select} FROM marked t {joins}""",
                {"before": before, "n": batch},
            )
            .mappings()
            .all()
        )
        if rows:
            delete_keys([key_of(level, row) for row in rows])
    return len(rows)


def retirement_due(
    engine: sa.Engine, level: Level, retention_s: float, max_completed: int, phases: PhaseRegistry = PHASES
) -> bool:
    """Whether `retire_batch` would retire anything of `level` now: as cheap as its own cut-off (at most
    max_completed + 1 index entries), then the oldest live completed partition, the first entry of the index.
    The oldest is read in index order and compared here: an EXISTS over `done_at < before` lets the planner expect
    an early match and scan the whole table, which is what it reads when nothing is due."""
    done_at = done_at_sql(level, phases)
    with engine.connect() as conn:
        before = retire_before(conn, level, retention_s, max_completed, phases)
        oldest = conn.exec_driver_sql(
            f"""SELECT {done_at} FROM {TABLE[level]} t WHERE {live_completed_sql(level, phases)}
                ORDER BY {done_at} LIMIT 1"""
        ).scalar()
    return oldest is not None and oldest < before


def live_completed(engine: sa.Engine, level: Level, phases: PhaseRegistry = PHASES) -> int:
    """How many completed partitions of `level` are live (tests and benchmarks; linear in that number)."""
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            f"SELECT count(*) FROM {TABLE[level]} t WHERE {live_completed_sql(level, phases)}"
        ).scalar_one()
