"""Files read into the kernel's page cache ahead of their use, beside other work.

The embedded store reads the main shard's quantized vectors through before its first search (resources/
qdrant_edge_shard.py), and would otherwise do so after the shard's loading, which holds the GIL from start to end.
A file sent to /dev/null by the kernel (sendfile) is read into the cache in one system call, outside the GIL and
without a copy into this process, so the reading runs in a thread while the loading goes on. Where the kernel
cannot send a file to /dev/null, the thread reads it in blocks instead.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from threading import Thread

BLOCK_BYTES = 4 << 20
# what sendfile answers where it cannot write to /dev/null (the file is then read in blocks)
_UNSENDABLE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSOCK}


def read_into_cache(path: Path) -> None:
    """Read `path` whole, so that the kernel keeps its pages; raises OSError when it cannot be read."""
    with open(path, "rb", buffering=0) as handle:
        offset = _sent(handle.fileno())
        handle.seek(offset)
        while handle.read(BLOCK_BYTES):
            pass


def _sent(fd: int) -> int:
    """How far the kernel sent the file to /dev/null (its size when sendfile can)."""
    size, offset = os.fstat(fd).st_size, 0
    with open(os.devnull, "wb", buffering=0) as null:
        try:
            while offset < size:
                sent = os.sendfile(null.fileno(), fd, offset, size - offset)
                if not sent:
                    break
                offset += sent
        except OSError as exc:
            if exc.errno not in _UNSENDABLE:
                raise
    return offset


def reading(paths: Iterable[Path]) -> Thread:
    """A started thread reading `paths` into the cache, one after the other; a file that cannot be read (replaced
    meanwhile) is left to be read as it is used."""

    def read_all() -> None:
        for path in paths:
            try:
                read_into_cache(path)
            except OSError:
                continue

    thread = Thread(target=read_all, name="docqueue-read-through", daemon=True)
    thread.start()
    return thread
