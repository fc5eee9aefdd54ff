"""One embedded storage folder, opened by one process at a time: a cross-process lock file and a per-process gate.

Embedded storage is single-process, so every embedded store opens its folder only for the length of one operation
(or of a ``with store.session():`` block) under a docqueue lock file. A waiter retries until its lock timeout
(DOCQUEUE_QDRANT_LOCK_TIMEOUT) and then raises QdrantStorageBusy. A holder may keep the folder open for a linger
after its last operation; a waiter asks it to let go by touching `<lock>.wait`.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import random
import threading
import time
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE_NAME = ".docqueue.lock"
LINGER_TICK_S = 0.05
# how long a process that let go of the folder because another asked for it stays away before taking it again: more
# than a waiter's longest poll (0.2 s with jitter, _acquire_lock_file), so the waiter gets its turn rather than
# losing every race to a holder that operates back to back (a search session beside a run)
HANDOVER_S = 0.15


class QdrantStorageBusy(TimeoutError):
    """Another process kept the embedded Qdrant folder longer than the lock timeout."""


def _acquire_lock_file(lock_path: Path, deadline: float, timeout_s: float):
    # flock(2), the call portalocker makes on POSIX, so processes of older versions and this one exclude each other;
    # called directly because importing portalocker brings in the Redis client, a tenth of a second per command
    handle = open(lock_path, "a+")  # noqa: SIM115  (held open until the lock is released)
    delay = 0.01
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            _ask_for_turn(lock_path)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                handle.close()
                raise QdrantStorageBusy(
                    f"embedded Qdrant storage {lock_path.parent} stayed locked by another process for "
                    f"{timeout_s:g}s (DOCQUEUE_QDRANT_LOCK_TIMEOUT); set DOCQUEUE_QDRANT_URL to a Qdrant "
                    f"server for concurrent access"
                ) from None
            # jitter keeps two waiters from polling in lockstep
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 0.05)  # short: a holder that let go for a waiter stays away HANDOVER_S


def _release_lock_file(handle) -> None:
    try:
        fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


def _wait_file(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".wait")


def _ask_for_turn(lock_path: Path) -> None:
    """Tell a holder that keeps the folder open between operations that another process is waiting."""
    try:
        _wait_file(lock_path).touch()
    except OSError:
        pass  # the holder then lets go when its linger ends instead


def _asked_since(lock_path: Path, since_ns: int) -> bool:
    try:
        return _wait_file(lock_path).stat().st_mtime_ns >= since_ns
    except OSError:
        return False


class LocalFolder:
    """Per-process gate to one embedded storage folder, shared by every store that uses it.

    The RLock serialises threads (and lets a session nest operations); the lock file
    serialises processes. The handle (a local-mode client or an Edge shard, anything with
    close()) is opened by the first operation and, with `linger_s` > 0, kept after the last
    one for up to `linger_s` seconds of idleness, so a run's consecutive writes share one
    opening; a process waiting for the lock touches `<lock>.wait`, and a lingering holder
    lets go within LINGER_TICK_S of that (or right after its current operation).
    """

    def __init__(self, folder: Path, lock_path: Path, opener, linger_s: float = 0.0):
        self.folder = folder
        self.lock_path = lock_path
        self.linger_s = linger_s
        self._opener = opener  # (folder, deadline, timeout_s) -> handle
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._gate = threading.RLock()
        self._depth = 0
        self._handle = None
        self._lock_handle = None
        self._opened_ns = 0
        self._idle_since = 0.0
        self._ticking = False
        self._away_until = 0.0  # HANDOVER_S after letting go for a waiter

    @contextmanager
    def open(self, timeout_s: float):
        if self._pid != os.getpid():
            # a forked child shares the parent's open handle and lock: it must not use or close them
            self._reset()
        deadline = time.monotonic() + timeout_s
        if not self._gate.acquire(timeout=max(timeout_s, 0)):
            raise QdrantStorageBusy(
                f"embedded Qdrant storage {self.folder} stayed busy in this process for {timeout_s:g}s "
                f"(DOCQUEUE_QDRANT_LOCK_TIMEOUT)"
            )
        try:
            if self._handle is None:
                if self._lock_handle is None:
                    self._connect(deadline, timeout_s)
                else:  # closed under the lock (close_handle: its folder swapped or dropped) and wanted again
                    self._handle = self._opener(self.folder, deadline, timeout_s)
            self._depth += 1
            try:
                yield self._handle
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._idle()
        finally:
            self._gate.release()

    def _connect(self, deadline: float, timeout_s: float) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        away = min(self._away_until, deadline) - time.monotonic()
        if away > 0:
            time.sleep(away)
        self._lock_handle = _acquire_lock_file(self.lock_path, deadline, timeout_s)
        self._opened_ns = time.time_ns()
        try:
            self._handle = self._opener(self.folder, deadline, timeout_s)
        except BaseException:
            _release_lock_file(self._lock_handle)
            self._lock_handle = None
            raise

    def _idle(self) -> None:
        if self.linger_s <= 0 or self._handle is None or _asked_since(self.lock_path, self._opened_ns):
            self._disconnect()
            if self._handle is None:
                return
        self._idle_since = time.monotonic()
        if not self._ticking:
            self._ticking = True
            self._schedule()

    def _schedule(self) -> None:
        timer = threading.Timer(min(LINGER_TICK_S, self.linger_s) or LINGER_TICK_S, self._tick)
        timer.daemon = True
        timer.start()

    def _tick(self) -> None:
        with self._gate:
            if self._handle is None or self._pid != os.getpid():
                self._ticking = False
                return
            if self._depth == 0 and (
                time.monotonic() - self._idle_since >= self.linger_s or _asked_since(self.lock_path, self._opened_ns)
            ):
                self._disconnect()
                if self._handle is None:
                    self._ticking = False
                    return
            self._schedule()  # still open: in use, lingering, or kept until the exit and not asked for

    @contextmanager
    def held(self, timeout_s: float):
        """The folder's locks (this process's and the lock file) with no handle open: to rename a folder that
        cannot be opened (a damaged shard set aside). The next operation opens the folder again."""
        if self._pid != os.getpid():
            self._reset()
        if not self._gate.acquire(timeout=max(timeout_s, 0)):
            raise QdrantStorageBusy(
                f"embedded Qdrant storage {self.folder} stayed busy in this process for {timeout_s:g}s "
                f"(DOCQUEUE_QDRANT_LOCK_TIMEOUT)"
            )
        try:
            self.close_handle()
            taken = None
            if self._lock_handle is None:
                self.lock_path.parent.mkdir(parents=True, exist_ok=True)
                taken = _acquire_lock_file(self.lock_path, time.monotonic() + timeout_s, timeout_s)
            try:
                yield
            finally:
                if taken is not None:
                    _release_lock_file(taken)
        finally:
            self._gate.release()

    def close_handle(self) -> None:
        """Close the open handle while keeping the lock file (to swap the folder under it); the next operation
        opens the folder again."""
        with self._gate:
            if self._handle is not None:
                try:
                    self._handle.close()
                finally:
                    self._handle = None

    def release(self) -> None:
        """Close a lingering handle now (at exit, or before handing the folder to another process)."""
        if self._pid != os.getpid():
            return
        with self._gate:
            if self._depth == 0 and self._handle is not None:
                self._disconnect()

    def _disconnect(self) -> None:
        asked = self._lock_handle is not None and _asked_since(self.lock_path, self._opened_ns)
        if _kept_until_exit and not asked:
            return  # the process ends next, and its end lets go (keep_open_until_exit)
        if asked:
            self._away_until = time.monotonic() + HANDOVER_S
        try:
            if self._handle is not None:
                self._handle.close()
        finally:
            self._handle = None
            if self._lock_handle is not None:
                _release_lock_file(self._lock_handle)
                self._lock_handle = None


_FOLDERS: dict[str, LocalFolder] = {}
_FOLDERS_LOCK = threading.Lock()
_kept_until_exit = False


def local_folder(folder: Path, opener, lock_path: Path | None = None, linger_s: float = 0.0) -> LocalFolder:
    """The process-wide gate of one embedded folder; the lock file sits in it unless `lock_path` says otherwise."""
    folder = Path(folder).expanduser().resolve()
    lock = Path(lock_path).expanduser().resolve() if lock_path else folder / LOCK_FILE_NAME
    with _FOLDERS_LOCK:
        if str(lock) not in _FOLDERS:
            _FOLDERS[str(lock)] = LocalFolder(folder, lock, opener, linger_s)
        return _FOLDERS[str(lock)]


def release_lingering() -> None:
    """Close every folder this process keeps open between operations."""
    with _FOLDERS_LOCK:
        folders = list(_FOLDERS.values())
    for gate in folders:
        gate.release()


atexit.register(release_lingering)


def keep_open_until_exit() -> None:
    """This process ends next, without the interpreter's teardown (orchestration/cli/startup.exit_at_once), and
    wrote nothing to its folders: what it holds open stays open until then, and the kernel lets go of the lock
    files with the process. Qdrant Edge evicts a shard's files from the page cache as it closes the shard (a
    segment dropped clears its cache), so a short process that closes its shards leaves the next one to read them
    from disk again; one that ends with them open leaves what it read cached. Another process that asks for a
    folder meanwhile (its `.wait` file) still gets it within LINGER_TICK_S, closed as any holder closes it, so an
    end held up (output into a full pipe) keeps no writer waiting. A shard left open is not flushed: whatever its
    opening wrote stays in its log, and the next opening replays it."""
    global _kept_until_exit
    _kept_until_exit = True


def _forget_folders_after_fork() -> None:
    # a forked child must not inherit a parent's half-held gate or open handle, nor its plan to end
    global _FOLDERS_LOCK, _kept_until_exit
    _FOLDERS.clear()
    _FOLDERS_LOCK = threading.Lock()
    _kept_until_exit = False


os.register_at_fork(after_in_child=_forget_folders_after_fork)


def open_waiting_for_outsiders(open_once, busy, folder: Path, deadline: float, timeout_s: float):
    """Call `open_once` until it stops failing with an error `busy` recognises: a holder of the folder that does
    not take docqueue's lock file."""
    delay = 0.05
    while True:
        try:
            return open_once()
        except Exception as exc:
            if not busy(exc):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QdrantStorageBusy(
                    f"embedded Qdrant storage {folder} is held by a client outside docqueue for more than "
                    f"{timeout_s:g}s (DOCQUEUE_QDRANT_LOCK_TIMEOUT)"
                ) from None
            time.sleep(min(remaining, delay))
            delay = min(delay * 2, 0.5)
