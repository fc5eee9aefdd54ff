"""The retry rule's two ways of meeting a database that refuses: a full server (every connection slot taken) is
waited out with one log line, for a bounded time; any other transient failure gets its few quick attempts."""

from __future__ import annotations

import logging

import psycopg
import pytest
import sqlalchemy as sa

from queue_db import transactions
from queue_db.transactions import is_connection_limit, with_retries

FULL = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many clients already'
)
RESERVED = "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute"


def _refused(text: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError(text))


def _failing(errors: list[BaseException]):
    calls = []

    def attempt():
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "done"

    return attempt, calls


def test_a_full_server_is_recognised_by_its_refusal():
    assert is_connection_limit(_refused(FULL)) and is_connection_limit(_refused(RESERVED))
    assert is_connection_limit(psycopg.OperationalError(FULL))
    assert not is_connection_limit(_refused("connection refused")) and not is_connection_limit(ValueError(FULL))


def test_a_full_server_is_waited_out_past_the_attempts_with_one_line(monkeypatch, caplog):
    monkeypatch.setattr(transactions.time, "sleep", lambda s: None)
    attempt, calls = _failing([_refused(FULL) for _ in range(transactions.ATTEMPTS + 3)])
    with caplog.at_level(logging.WARNING, logger="queue_db.transactions"):
        assert with_retries(attempt) == "done"
    assert len(calls) == transactions.ATTEMPTS + 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "no free connection" in lines[0] and "accepts connections again" in lines[1], lines
    assert not any(r.exc_info for r in caplog.records)


def test_the_wait_for_a_slot_is_bounded(monkeypatch):
    monkeypatch.setattr(transactions.time, "sleep", lambda s: None)
    attempt, _ = _failing([_refused(FULL) for _ in range(50)])
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(transactions.time, "monotonic", lambda: next(clock))
    with pytest.raises(sa.exc.OperationalError):
        with_retries(attempt, connection_wait_s=30)


def test_other_transient_failures_keep_their_few_attempts(monkeypatch):
    monkeypatch.setattr(transactions.time, "sleep", lambda s: None)
    attempt, calls = _failing([_refused("server closed the connection") for _ in range(20)])
    with pytest.raises(sa.exc.OperationalError):
        with_retries(attempt)
    assert len(calls) == transactions.ATTEMPTS
    attempt, calls = _failing([_refused("connection refused")])
    with pytest.raises(sa.exc.OperationalError):
        with_retries(attempt, attempts=1)  # the CLI: a server that is down is reported at once
    assert len(calls) == 1


def test_a_lost_pipeline_sync_is_not_logged_twice(caplog):
    import psycopg._pipeline  # noqa: F401  (the logger psycopg's pipeline writes to)

    pipeline = object.__new__(psycopg.Pipeline)
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        logging.getLogger("psycopg").warning(
            "error ignored terminating %r: %s", pipeline, psycopg.OperationalError("the connection is lost")
        )
        logging.getLogger("psycopg").warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_a_sensor_ticks_bound_caps_every_wait_inside_it(monkeypatch, caplog):
    from queue_db.transactions import connection_wait

    monkeypatch.setattr(transactions.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(transactions.time, "monotonic", lambda: next(clock))
    inner, inner_calls = _failing([_refused(FULL) for _ in range(500)])

    def tick():
        return with_retries(inner)  # a queue call inside the tick, with the queue's own 300 s wait

    with caplog.at_level(logging.WARNING, logger="queue_db.transactions"):
        with connection_wait(20), pytest.raises(sa.exc.OperationalError):
            with_retries(tick)
    assert len(inner_calls) < 10, len(inner_calls)  # 20 s of a clock that moves 5 s a look, not 300 s
    assert sum("no free connection" in r.getMessage() for r in caplog.records) == 1
