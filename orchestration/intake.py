"""Registering files as documents: content-addressed storage, idempotent on the bytes, type from content.

Shared by `docqueue ingest` and the inbox sensor. Files are copied into storage under their sha256, so the same
bytes twice are one document and one file can never overwrite another's.
"""
from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from queue_db.lifecycle import mark_supersedes, previous_version
from queue_db.queue import TaskQueue
from resources.ocr import PdfLimits
from resources.storage import LocalStorage

PDF_MAGIC = b"%PDF-"


@dataclass
class IngestResult:
    path: str
    status: str  # new | new-version | duplicate | rejected
    document_id: str | None = None
    document_key: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict:
        return {"path": self.path, "status": self.status, "document_id": self.document_id,
                "document_key": self.document_key, "reason": self.reason}


class IntakeError(ValueError):
    pass


def detect_type(head: bytes) -> str:
    """Content decides, not the extension. PDF readers accept the header within the first KiB."""
    if PDF_MAGIC in head[:1024]:
        return "application/pdf"
    if head.startswith(b"\x89PNG"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    if head.startswith(b"PK\x03\x04"):
        return "application/zip"
    return "application/octet-stream"


def iter_files(paths: Iterable[str | Path], root: Path | None = None) -> Iterator[Path]:
    """Regular files under `paths`, recursively, sorted. With `root`, nothing outside it is ever yielded:
    symlinks are not followed and paths resolving outside the root (`..`, links) are skipped."""
    for raw in paths:
        path = Path(raw)
        if root is not None and not _inside(path, root):
            continue
        if path.is_symlink():
            continue
        if path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
                dirnames.sort()
                for name in sorted(filenames):
                    candidate = Path(dirpath) / name
                    if candidate.is_symlink() or (root is not None and not _inside(candidate, root)):
                        continue
                    if stat.S_ISREG(candidate.lstat().st_mode):
                        yield candidate
        elif path.exists() and stat.S_ISREG(path.lstat().st_mode):
            yield path


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except (ValueError, OSError):
        return False


def _hash_file(path: Path, limit: int) -> tuple[str, int, bytes]:
    digest, size, head = hashlib.sha256(), 0, b""
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            if not head:
                head = chunk[:2048]
            size += len(chunk)
            if size > limit:
                raise IntakeError(f"too large: more than {limit // (1 << 20)} MB (DOCQUEUE_MAX_FILE_MB)")
            digest.update(chunk)
    return digest.hexdigest(), size, head


def ingest_file(queue: TaskQueue, storage: LocalStorage, path: Path, *, priority: int = 0,
                password_ref: str | None = None, limits: PdfLimits | None = None) -> IngestResult:
    limits = limits or PdfLimits.from_env()
    shown = os.fsdecode(path)
    try:
        content_hash, size, head = _hash_file(path, limits.max_file_bytes)
    except IntakeError as exc:
        return IngestResult(shown, "rejected", reason=str(exc))
    except OSError as exc:
        return IngestResult(shown, "rejected", reason=f"unreadable: {exc.strerror}")
    if size == 0:
        return IngestResult(shown, "rejected", reason="empty: zero-byte file")
    mime = detect_type(head)
    if mime != "application/pdf":
        return IngestResult(shown, "rejected", reason=f"unsupported: not a PDF (content looks like {mime})")
    storage_key = f"documents/{content_hash[:2]}/{content_hash}.pdf"
    if not storage.exists(storage_key):
        storage.put_file(storage_key, path)
    name = path.name
    source_path = os.fsdecode(path.resolve())
    # a known path with new content is a new version: it replaces the old one once fully indexed
    previous = previous_version(queue, source_path, content_hash)
    document, created = queue.register_document(
        filename=name, content_hash=content_hash, size_bytes=size, storage_key=storage_key,
        source_path=source_path, priority=priority, password_ref=password_ref, mime_type=mime,
        filename_bytes=os.fsencode(name))
    if created and previous is not None:
        mark_supersedes(queue, str(document["id"]), previous["id"])
        return IngestResult(shown, "new-version", str(document["id"]), document["document_key"],
                            reason=f"replaces {previous['document_key']} once indexed")
    return IngestResult(shown, "new" if created else "duplicate", str(document["id"]), document["document_key"])


def ingest_paths(queue: TaskQueue, storage: LocalStorage, paths: Iterable[str | Path], *, priority: int = 0,
                 password_ref: str | None = None, root: Path | None = None) -> list[IngestResult]:
    limits = PdfLimits.from_env()
    return [ingest_file(queue, storage, p, priority=priority, password_ref=password_ref, limits=limits)
            for p in iter_files(paths, root)]
