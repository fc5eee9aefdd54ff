"""A sensor tick the queue database cannot serve right now (a killed backend, a restart, every connection slot
taken) is retried briefly, then skipped with one sentence: the daemon logs no traceback and the next tick tries
again. Every sensor of the code location evaluates through `surviving_database`."""

from __future__ import annotations

from typing import Callable, TypeVar

import dagster as dg
import sqlalchemy as sa

from queue_db.transactions import connection_wait, is_transient, with_retries

T = TypeVar("T")

# well within the 60 s the daemon grants one sensor evaluation: a longer wait is the next tick's
SENSOR_CONNECTION_WAIT_S = 20.0


def surviving_database(context: dg.SensorEvaluationContext, evaluate: Callable[[], T]) -> T | dg.SkipReason:
    """`evaluate()` (the tick: idempotent, so it is safe to run again), retried over transient database failures;
    still failing, a skipped tick that says why."""
    try:
        with connection_wait(SENSOR_CONNECTION_WAIT_S):  # the waits of the queue calls inside the tick too
            return with_retries(evaluate)
    except sa.exc.DBAPIError as exc:
        if not is_transient(exc):
            raise
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = (
            f"the queue database is unavailable ({lines[0] if lines else type(exc).__name__}); the next tick retries"
        )
        context.log.warning(reason)
        return dg.SkipReason(reason)
