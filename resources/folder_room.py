"""Room on the file system of a folder a store writes to: a write is refused while less than a headroom is free,
and a file system that fills anyway reads as one sentence naming the folder (resources/disk_space.DiskFull)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from resources.disk_space import DiskFull, no_space

# The engine writes its WAL and segments through memory maps of sparse files, so on a full file system a write to a
# page it cannot have kills the process (SIGBUS) instead of raising. A write is refused, as DiskFull, while less than
# this is free: two of the engine's 32 MiB WAL segments, many times what one batch adds to the WAL, the vectors, the
# payload and its indexes.
WRITE_HEADROOM_BYTES = 64 << 20


def ensure_room(root: Path, extra_bytes: int = 0) -> None:
    """Refuse a write while the file system of `root` lacks WRITE_HEADROOM_BYTES plus what the write copies."""
    folder = root
    while not folder.exists() and folder != folder.parent:  # a store not yet made: its nearest existing parent
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    needed = WRITE_HEADROOM_BYTES + extra_bytes
    if free < needed:
        raise DiskFull(root, f"{free >> 20} MiB free, a write needs {needed >> 20} MiB")


@contextmanager
def room_for_write(root: Path, on_full: Callable[[], None], extra_bytes: int = 0) -> Iterator[None]:
    """A write with room checked first; the engine's own "no space" error (a file it writes outside its memory
    maps) as the same one sentence, after `on_full` (the store lets go of what it holds open, so the next operation
    opens afresh from what reached the disk)."""
    ensure_room(root, extra_bytes)
    try:
        yield
    except Exception as exc:
        if isinstance(exc, DiskFull) or not no_space(exc):
            raise
        on_full()
        raise DiskFull(root) from None


def allocated_bytes(folder: Path) -> int:
    """What a folder's files take on disk (their blocks: the engine's files are sparse)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.lstat().st_blocks * 512
        except OSError:  # replaced meanwhile
            continue
    return total
