"""A full file system, as docqueue tells it: its own module, so what only writes files (the storage folder that
`docqueue ingest` fills) need not load the stores' ports."""

from __future__ import annotations

import errno
from pathlib import Path

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFull(RuntimeError):
    """A folder docqueue writes to (the storage folder, the embedded store's) has no space left. Nothing is
    half-written; the work is retried once space is freed. Not an OSError: the callers that turn a file-system
    error into "cannot use the store" must let this sentence through as it is."""

    def __init__(self, folder: Path | str, detail: str = ""):
        self.folder = str(folder)
        super().__init__(f"disk full: no space left in {self.folder}{f' ({detail})' if detail else ''}")


def no_space(exc: BaseException) -> bool:
    """An error saying the file system is full: an OSError's errno, or the engine's message (Rust's io::Error
    reaches Python as text, e.g. "No space left on device (os error 28)")."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text
