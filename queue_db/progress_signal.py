"""What the runners of one queue tell each other between runs: "a run of mine ended" and "I went idle".

A runner with nothing ready, while tasks are held elsewhere, waits for them: their end can make work for it (a
page's chunks land in any registration block, a phase's roll-ups become due once its last task settles). And a
worker of `docqueue run --workers N` that is done waits for its siblings to go idle before it leaves. Waiting a
fixed poll leaves the cores idle for up to that poll after the work appears, or the run open that long after the
last sibling is done; a runner waits on this signal instead, with the poll as its longest wait, so work made by
runners that do not announce (a daemon's runs) is still found.

The signal is a PostgreSQL NOTIFY on one channel, sent once per run or per pass, never inside the queue's
transactions: NOTIFY serialises the commits of every transaction that sends one, which the hot path must not pay
per task.
"""

from __future__ import annotations

import contextlib
import os
import time
from enum import Enum
from typing import TYPE_CHECKING

import psycopg

from .transactions import is_database_error

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.pool import PoolProxiedConnection

CHANNEL = "docqueue_progress"


class News(str, Enum):
    RAN = "ran"  # a run ended: it may have made work for others
    IDLE = "idle"  # a worker ended a pass and found nothing to do


def announce(engine: sa.Engine, news: News = News.RAN) -> None:
    """Tell every listening runner `news` of this process (one round trip)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(
            "SELECT pg_notify(%(channel)s, %(payload)s)", {"channel": CHANNEL, "payload": f"{news.value}:{_me()}"}
        )


class ProgressListener:
    """A connection of its own (outside the engine's pool, held while the runner lives) that listens on the
    channel. `wait(s)` returns another process's news as soon as it is sent, or None once `s` passed. A
    notification sent while nobody waits is kept by the connection until the next wait, so none is missed (one
    sent while the connection is lost is: the wait is then the plain poll, and the next wait listens again). Of
    several waiting news, a wait returns the first that says a run ended, else an idle one."""

    def __init__(self, engine: sa.Engine):
        self._engine = engine
        self._raw: PoolProxiedConnection | None = None
        self._pg: psycopg.Connection | None = None
        self._me = _me()

    def _listening(self) -> psycopg.Connection | None:
        if self._pg is None:
            raw = None
            try:
                raw = self._engine.raw_connection()
                pg = raw.driver_connection
                raw.detach()  # closed with the listener, not returned to the pool
                assert isinstance(pg, psycopg.Connection), "the queue's engine runs on psycopg"
                if not pg.autocommit:
                    pg.rollback()
                    pg.autocommit = True
                pg.execute(f"LISTEN {CHANNEL}")
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                if raw is not None:  # a connection that could not listen is not kept open
                    with contextlib.suppress(psycopg.Error):
                        raw.close()
                return None
            self._raw, self._pg = raw, pg
        return self._pg

    def wait(self, timeout_s: float) -> News | None:
        """Sleep up to `timeout_s`; another process's news as soon as it arrives, else None."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        pg = self._listening()
        try:
            while pg is not None:
                heard: News | None = None
                # stop_after=1 still yields every notification of the packet that brought the first
                for notify in pg.notifies(timeout=max(deadline - time.monotonic(), 0.0), stop_after=1):
                    heard = self._stronger(heard, notify)
                if heard is not None:
                    for notify in pg.notifies(timeout=0):  # any more already waiting
                        heard = self._stronger(heard, notify)
                    return heard
                if deadline - time.monotonic() <= 0:
                    return None
        except psycopg.Error:
            self.close()  # the next wait listens on a new connection
        time.sleep(max(deadline - time.monotonic(), 0.0))
        return None

    def _stronger(self, heard: News | None, notify: psycopg.Notify) -> News | None:
        """Of what was heard so far and `notify`, the news that matters more: a run's end over an idle pass; a
        notification of this process's own, or one that is not news, changes nothing."""
        kind, _, sender = notify.payload.partition(":")
        if sender == self._me or kind not in (News.RAN.value, News.IDLE.value) or heard is News.RAN:
            return heard
        return News(kind)

    def close(self) -> None:
        raw, self._raw, self._pg = self._raw, None, None
        if raw is not None:
            with contextlib.suppress(psycopg.Error):
                raw.close()

    def __enter__(self) -> "ProgressListener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _me() -> str:
    return str(os.getpid())
