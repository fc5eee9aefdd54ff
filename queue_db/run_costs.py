"""What a run of each task kind costs, and the run size that keeps its fixed part a small share of it.

Every run of a task kind measures two things (orchestration.assets.common.materialize_range): the seconds from the
run's start to its work's start (launch, plan, resources, the executor's hand-over: the part every run pays
whatever it holds) and the seconds of work per partition key (claims, the work, settling, the per-key events).
`record_run_cost` folds them into the kind's one row of `run_costs` as a moving average, so the figures follow the
machine and the corpus without growing with either. The planners read the row (`run_costs`) and size the next runs
with `sized_keys`: OCR of scans, seconds a page, gets runs of a few pages that spread over every worker; text pages
and chunks, milliseconds a key, get runs large enough that their fixed cost is a small share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import sqlalchemy as sa


# the least fixed cost a run is sized for: what a run measures (its start to its work's start) leaves out its creation,
# its launch and its end events, which an empty run forked from the launcher's template spends in 0.34 s from
# launch to end (bench/run_launch.py); the measure alone would size `docqueue run`'s runs for 0.04 s
LEAST_OVERHEAD_S = 0.3
# weight of the newest run in the moving average: the figures follow a change of corpus within a few runs, and one
# run slowed by a neighbour moves them by a quarter of its difference
NEWEST_WEIGHT = 0.25

_RECORD_SQL = """
    INSERT INTO run_costs AS r (kind, key_seconds, overhead_seconds, runs, updated_at)
    VALUES (%(kind)s, %(key_s)s, %(overhead_s)s, 1, now())
    ON CONFLICT (kind) DO UPDATE SET
        key_seconds = r.key_seconds * (1 - %(w)s) + EXCLUDED.key_seconds * %(w)s,
        overhead_seconds = r.overhead_seconds * (1 - %(w)s) + EXCLUDED.overhead_seconds * %(w)s,
        runs = r.runs + 1,
        updated_at = now()"""


@dataclass(frozen=True)
class RunCost:
    """A kind's measured run: seconds of work per partition key and seconds a run spends before its work."""

    key_seconds: float
    overhead_seconds: float
    runs: int = 1


def seconds_before_work(began: float, run_started: float, handed: float | None = None) -> float:
    """A run's fixed part as it measures it: from its start (`run_started`, epoch seconds), or from when its step
    was handed to a worker of its own (`handed`: a Celery worker takes it from the broker, where it may have waited
    behind other runs' steps, which is the cluster's queue, not this run's cost), to `began`, when its work began."""
    return max(0.0, began - max(run_started, handed if handed is not None else run_started))


def record_run_cost(engine: sa.Engine, kind: str, *, keys: int, work_s: float, overhead_s: float) -> None:
    """Fold one run of `kind` (its `keys` partition keys took `work_s` seconds of work, after `overhead_s` seconds
    of the run before it) into the kind's figures. A run with no keys measures nothing and is not recorded."""
    if keys <= 0:
        return
    params = {"kind": kind, "key_s": max(0.0, work_s) / keys, "overhead_s": max(0.0, overhead_s), "w": NEWEST_WEIGHT}
    with engine.begin() as conn:
        conn.exec_driver_sql(_RECORD_SQL, params)


def run_costs(engine: sa.Engine) -> dict[str, RunCost]:
    """Every kind's measured run (one row a kind)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT kind, key_seconds, overhead_seconds, runs FROM run_costs").all()
    return {kind: RunCost(float(key_s), float(overhead_s), int(runs)) for kind, key_s, overhead_s, runs in rows}


def sized_keys(
    cost: RunCost | None, *, max_keys: int, overhead_share: float, ready: int | None = None, slots: int = 1
) -> int:
    """Partition keys for the next runs of a kind that costs `cost`.

    A run holds enough keys that its fixed cost is at most `overhead_share` of its work, and at most `max_keys`
    (DOCQUEUE_RUN_MAX_KEYS_<KIND>, which bounds what one failed run retries); the fixed cost is the measured one, and
    at least `LEAST_OVERHEAD_S`. Without a measured run a run holds `max_keys` (a first run measures the kind as it
    is); with sizing off (`overhead_share` 0), always. When `ready` keys would fill fewer than `slots` such runs (the
    runs of the kind that may go at once), they are spread over the slots instead, as long as each run still does at
    least as much work as its fixed cost: idle slots would cost more than a larger share."""
    if overhead_share <= 0:
        return max_keys
    if cost is None or cost.key_seconds <= 0:
        keys, least = max_keys, 1
    else:
        overhead_s = max(LEAST_OVERHEAD_S, cost.overhead_seconds)
        keys = min(max_keys, max(1, math.ceil(overhead_s / (overhead_share * cost.key_seconds))))
        least = min(keys, least_keys(cost))
    if ready is not None and slots > 1 and ready < slots * keys:
        keys = max(least, math.ceil(ready / slots))
    return keys


def least_keys(cost: RunCost | None) -> int:
    """The fewest keys whose work is worth a run of their own: as much work as the run's fixed cost (at least
    LEAST_OVERHEAD_S). 1 before the kind has been measured."""
    if cost is None or cost.key_seconds <= 0:
        return 1
    return max(1, math.ceil(max(LEAST_OVERHEAD_S, cost.overhead_seconds) / cost.key_seconds))


def run_size_rows(
    engine: sa.Engine, kinds: list[str], max_keys: Callable[[str], int], overhead_share: float
) -> list[dict]:
    """What the planners go by, per kind in pipeline order (`docqueue stats`): the runs measured, seconds of work a
    key, seconds before a run's work, and the keys a run of one slot is given (`max_keys(kind)`: the setting's
    maximum)."""
    costs = run_costs(engine)
    rows = []
    for kind in kinds:
        cost, most = costs.get(kind), max_keys(kind)
        rows.append(
            {
                "task_type": kind,
                "runs": cost.runs if cost else 0,
                "key_s": round(cost.key_seconds, 4) if cost else None,
                "overhead_s": round(cost.overhead_seconds, 3) if cost else None,
                "keys_per_run": sized_keys(cost, max_keys=most, overhead_share=overhead_share),
                "max_keys": most,
            }
        )
    return rows
