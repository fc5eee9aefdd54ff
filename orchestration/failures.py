"""Why a task failed, as the queue records it: a readable reason, an error class and whether a retry can help; and
the time limit a batch of chunk tasks runs under.
"""

from __future__ import annotations

import threading
from pathlib import Path

from orchestration.page_reading import PasswordError
from processing.chunking import ChunkingError
from processing.errors import DocumentError
from resources.disk_space import DiskFull, no_space
from resources.ports import CredentialsRefused, GraphStoreDamaged, VectorStoreDamaged

# failures that say nothing about a chunk's own content: redoing a batch one chunk at a time would only repeat them
SERVICE_ERROR_CLASSES = frozenset({"connection", "timeout", "auth", "disk_full", "damaged_store"})


class BatchTimeout(TimeoutError):
    pass


def within(limit_s: float, what: str, work):
    """Run `work` with a time limit. A thread cannot be killed: on timeout it is abandoned (its result ignored)
    and the batch fails as `timeout`, to be retried; the library's own timeouts bound how long it lingers."""
    box: dict = {}

    def target():
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"{what}-batch", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise BatchTimeout(f"timeout: {what} batch took more than {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def refused_credentials(exc: BaseException) -> bool:
    """A service that refused our user, password or key. Asking again cannot help and costs a failed login each
    time, which servers count toward locking the account (ArcadeDB locks it for about half a minute)."""
    if isinstance(exc, CredentialsRefused):  # the adapters' own (the LLM endpoint's 401/403)
        return True
    # the Bolt driver's AuthError and its TokenExpired reach here unwrapped from every graph call; matched by name,
    # so that the failure rules do not load the driver
    return any(cls.__name__ == "AuthError" for cls in type(exc).__mro__)


def classify(exc: BaseException) -> tuple[str, str, bool]:
    """(reason, error class, retryable) for an exception raised while processing one task."""
    if refused_credentials(exc):
        return f"auth: credentials refused, fix them and `docqueue retry` ({type(exc).__name__}: {exc})", "auth", False
    if isinstance(exc, DocumentError):
        return exc.reason, exc.error_class, exc.retryable
    if isinstance(exc, PasswordError):
        return f"encrypted: {exc}", "encrypted", False
    if isinstance(exc, ChunkingError):
        return f"chunking: {exc}", "validation", False
    if isinstance(exc, BatchTimeout):
        return str(exc), "timeout", True
    if isinstance(exc, (VectorStoreDamaged, GraphStoreDamaged)):
        # the store's files, not the chunk: one sentence naming the folder and `docqueue repair`; retried with
        # back-off, so work resumes by itself once the store is repaired
        return str(exc), "damaged_store", True
    if isinstance(exc, DiskFull):  # the adapter named the folder it writes to
        return f"{exc}; the task is retried once space is freed", "disk_full", True
    if no_space(exc):  # a write outside the adapters: the folder of the file it was writing
        filename = getattr(exc, "filename", None)
        folder = Path(filename).parent if filename else "a folder docqueue writes to"
        return f"{DiskFull(folder)}; the task is retried once space is freed", "disk_full", True
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return f"{type(exc).__name__}: {exc}", "connection", True
    name = type(exc).__name__
    if "ServiceUnavailable" in name or "Connect" in name or "Timeout" in name or "Unavailable" in name:
        return f"{name}: {exc}", "connection", True
    return f"{name}: {exc}", "internal", True
