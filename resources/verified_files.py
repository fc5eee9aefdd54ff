"""A record of the large files whose sha256 was checked, so a process that loads the same unchanged file again need
not read it whole to hash it (the embedding model: 23 MB, a noticeable part of a `docqueue search`'s start-up).

The record keeps, per file, the hash found and what the file system says of the file when it was hashed: its
device, inode, size, modification and status-change times. A file replaced (a new inode), rewritten (a new size or
modification time) or given back an old modification time (which sets its status-change time anew) no longer
matches and is hashed again. The record is a convenience: one that cannot be read or written is ignored, and the
file is hashed as if there were none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


def _stamp(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {
        "dev": stat.st_dev,
        "ino": stat.st_ino,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }


def _read(record: Path) -> dict[str, Any]:
    try:
        entries = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def verified_sha256(path: Path, expected: str, record: Path | None, sha256: Callable[[Path], str]) -> str:
    """The sha256 of `path`: `expected` when `record` says this very file was hashed to it before, else computed
    by `sha256` (and noted in `record` when it is the expected one)."""
    path = Path(path)
    if record is None:
        return sha256(path)
    key = str(path.resolve())
    before = _stamp(path)
    if _read(record).get(key) == {**before, "sha256": expected}:
        return expected
    actual = sha256(path)
    if actual == expected and _stamp(path) == before:  # unchanged while it was read
        _write(record, key, {**before, "sha256": actual})
    return actual


def _write(record: Path, key: str, entry: dict[str, Any]) -> None:
    """Adds `entry` under `key`, replacing the record whole (a reader sees the old one or the new one)."""
    entries = {**_read(record), key: entry}
    scratch = record.with_name(f".{record.name}.{os.getpid()}")
    try:
        scratch.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(scratch, record)
    except OSError:
        scratch.unlink(missing_ok=True)
