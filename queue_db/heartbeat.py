"""Heartbeats from a background thread while a worker processes claimed tasks.

The CPU-heavy work (PDF rendering, OCR) runs in a child process and the embedding/extraction libraries release
the GIL, so this thread keeps beating while the work runs. Tasks the queue says we no longer own (recovered and
re-claimed elsewhere) are reported in `lost`, so the caller can stop working on them.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable

from .phases import TaskKind
from .queue import TaskQueue

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self, queue: TaskQueue, kind: TaskKind, worker_id: str, ids: Iterable[str] = (), interval_s: float | None = None
    ):
        self.queue, self.kind, self.worker_id = queue, kind, worker_id
        self.interval_s = interval_s if interval_s is not None else queue.settings.heartbeat_interval_s
        self._ids: set[str] = {str(i) for i in ids}
        self.lost: set[str] = set()
        self.beats = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{kind.name}", daemon=True)

    def add(self, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids.update(str(i) for i in ids)

    def remove(self, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids.difference_update(str(i) for i in ids)

    def beat(self) -> None:
        with self._lock:
            ids = list(self._ids)
        if not ids:
            return
        owned = self.queue.heartbeat(self.kind, self.worker_id, ids)
        self.beats += 1
        gone = set(ids) - owned
        if gone:
            with self._lock:
                # only tasks still tracked count as lost (one finished meanwhile is not)
                gone &= self._ids
                self.lost |= gone
                self._ids -= gone

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # a database hiccup must not kill the thread; the next beat retries
                self.errors += 1
                log.warning("heartbeat for %s failed; retrying next interval", self.kind.name, exc_info=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.interval_s))
