"""The runners' news (queue_db.progress_signal) over a real PostgreSQL: a wait ends at another process's news, keeps
news sent while nobody waited, ignores its own process's, prefers a run's end to an idle pass, and outlives a lost
connection. Every wait that must end early is given 30 s: one that does not end early fails the test."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from queue_db import progress_signal
from queue_db.progress_signal import News, ProgressListener, announce

LONG_S = 30.0


@pytest.fixture
def listener(engine):
    with ProgressListener(engine) as listening:
        assert listening.wait(0) is None  # listening from here on
        yield listening


@pytest.fixture
def elsewhere(monkeypatch):
    """Announcements made from here on come from another process, as far as the listener can tell."""
    monkeypatch.setattr(progress_signal, "_me", lambda: "another-process")


def announce_soon(engine, news: News, after_s: float = 0.2) -> threading.Timer:
    timer = threading.Timer(after_s, announce, (engine, news))
    timer.start()
    return timer


def test_a_wait_ends_at_another_process_news(engine, listener, elsewhere):
    announce_soon(engine, News.RAN)
    assert listener.wait(LONG_S) is News.RAN
    announce_soon(engine, News.IDLE)
    assert listener.wait(LONG_S) is News.IDLE


def test_news_sent_while_nobody_waits_is_kept_for_the_next_wait(engine, listener, elsewhere):
    announce(engine, News.RAN)
    assert listener.wait(LONG_S) is News.RAN
    assert listener.wait(0.2) is None  # read once


def test_a_process_does_not_wake_itself(engine, listener):
    announce(engine, News.RAN)
    assert listener.wait(0.5) is None


def delivered(listening: ProgressListener) -> None:
    """Return once every notification already sent has reached the listener. A commit signals the listening backend
    before the sender hears of it, and the backend sends what it was signalled before it answers a query; psycopg
    keeps notifications that arrive during a query for the next wait. Without this round trip, a wait may read the
    first notification while the second is still on its way."""
    assert listening._pg is not None
    listening._pg.execute("SELECT 1")


def test_a_runs_end_wins_over_an_idle_pass_waiting_beside_it(engine, listener, elsewhere):
    announce(engine, News.IDLE)
    announce(engine, News.RAN)
    delivered(listener)
    assert listener.wait(LONG_S) is News.RAN


def test_a_lost_connection_is_a_plain_poll_then_the_next_wait_listens_again(engine, listener, elsewhere):
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        pid = listener._pg.info.backend_pid
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    assert listener.wait(0.3) is None  # the broken connection is dropped, the wait sleeps out its time
    timer = announce_soon(engine, News.RAN, after_s=0.5)
    assert listener.wait(LONG_S) is News.RAN
    timer.join()
    assert listener._pg.info.backend_pid != pid
