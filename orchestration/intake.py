"""Registering files as documents: content-addressed storage, idempotent on the bytes, type from content.

Shared by `docqueue ingest`, the inbox sensor and the object-store intake. Files are copied into storage under
their sha256, so the same bytes twice are one document and one file can never overwrite another's.

The type comes from the content, never from the name: PDF; PNG, JPEG and TIFF images (OCR); EPUB and XPS
(laid out by PyMuPDF); plain text, Markdown and HTML; DOCX, XLSX and CSV (page markdown without OCR). Anything
else is rejected here, with what it looks like, and nothing is registered.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from processing.content_types import EXTENSIONS, detect_type, rejection_reason
from processing.office_pages import CSV_MIME, ZIPPED_TYPES, OfficeLimits, archive_problem
from processing.text_pages import TEXT_TYPES, TextLimits
from queue_db.config import Settings
from queue_db.idempotency import IdempotencyConflict, checked_key
from queue_db.lifecycle import mark_supersedes, move_source, previous_version
from queue_db.queue import TaskQueue, source_path_text
from queue_db.tenants import BASE_TENANT, checked_tenant, tenant_storage_prefix
from resources.pdf_limits import PdfLimits
from resources.storage import LocalStorage


@dataclass
class IngestResult:
    path: str
    status: str  # new | new-version | duplicate | rejected
    document_id: str | None = None
    document_key: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "status": self.status,
            "document_id": self.document_id,
            "document_key": self.document_key,
            "reason": self.reason,
        }


class IntakeError(ValueError):
    pass


@dataclass(frozen=True)
class IntakeRules:
    """What intake holds a file to, as the entry point's settings give them: the file bounds (DOCQUEUE_MAX_FILE_MB,
    DOCQUEUE_MAX_PAGES, ...), the text and office bounds (DOCQUEUE_MAX_TEXT_MB, DOCQUEUE_MAX_UNZIPPED_MB, ...) and
    the tenant of a file registered without one (DOCQUEUE_DEFAULT_TENANT). Unset: the defaults."""

    pdf: PdfLimits = field(default_factory=PdfLimits)
    text: TextLimits = field(default_factory=TextLimits)
    office: OfficeLimits = field(default_factory=OfficeLimits)
    default_tenant: str = BASE_TENANT

    @classmethod
    def from_settings(cls, settings: Settings) -> "IntakeRules":
        storage = settings.storage
        return cls(
            PdfLimits.from_config(storage),
            TextLimits.from_config(storage),
            OfficeLimits.from_config(storage),
            settings.tenant.default_tenant,
        )


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


def too_large(limit: int) -> str:
    """Why a file past DOCQUEUE_MAX_FILE_MB (`limit` bytes) is refused."""
    return f"too large: more than {limit / (1 << 20):.3g} MB (DOCQUEUE_MAX_FILE_MB)"


def _hash_file(path: Path, limit: int) -> tuple[str, int, bytes]:
    digest, size, head = hashlib.sha256(), 0, b""
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            if len(head) < 2048:
                head += chunk[: 2048 - len(head)]
            size += len(chunk)
            if size > limit:
                raise IntakeError(too_large(limit))
            digest.update(chunk)
    return digest.hexdigest(), size, head


def ingest_file(
    queue: TaskQueue,
    storage: LocalStorage,
    path: Path,
    *,
    priority: int = 0,
    password_ref: str | None = None,
    rules: IntakeRules | None = None,
    source_path: str | None = None,
    name: str | None = None,
    metadata: dict | None = None,
    idempotency_key: str | None = None,
    tenant: str | None = None,
) -> IngestResult:
    """Register one file. `source_path` and `name` override where it came from (an object store downloads to a
    temporary file); a known source path with new content is a new version. With `idempotency_key`, the key
    names the document: the same key again is a duplicate, the key with other bytes is rejected."""
    return _register(
        queue,
        storage,
        path,
        shown=source_path or os.fsdecode(path),
        name=name or path.name,
        source_path=source_path or os.fsdecode(path.resolve()),
        priority=priority,
        password_ref=password_ref,
        rules=rules,
        metadata=metadata,
        idempotency_key=idempotency_key,
        tenant=tenant,
    )


def ingest_stream(
    queue: TaskQueue,
    storage: LocalStorage,
    stream: BinaryIO,
    name: str,
    *,
    scratch: Path,
    priority: int = 0,
    idempotency_key: str | None = None,
    tenant: str | None = None,
    rules: IntakeRules | None = None,
) -> IngestResult:
    """Register content read from a stream (standard input) under `name`, bounded by DOCQUEUE_MAX_FILE_MB while
    it is read. It has no source path, so it is never a new version of anything: the bytes (or the idempotency
    key) identify it."""
    rules = rules or IntakeRules()
    limits = rules.pdf
    shown = f"-:{name}"
    if not name.strip() or "/" in name or "\\" in name or name in (".", ".."):
        return IngestResult(shown, "rejected", reason=f"invalid name {name!r}: give a file name such as note.md")
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stdin-", dir=scratch) as folder:
        path = Path(folder) / "content"
        size = 0
        with open(path, "wb") as handle:
            while chunk := stream.read(1 << 20):
                size += len(chunk)
                if size > limits.max_file_bytes:
                    return IngestResult(shown, "rejected", reason=too_large(limits.max_file_bytes))
                handle.write(chunk)
        return _register(
            queue,
            storage,
            path,
            shown=shown,
            name=name,
            source_path=None,
            priority=priority,
            password_ref=None,
            rules=rules,
            metadata=None,
            idempotency_key=idempotency_key,
            tenant=tenant,
        )


def _register(
    queue: TaskQueue,
    storage: LocalStorage,
    path: Path,
    *,
    shown: str,
    name: str,
    source_path: str | None,
    priority: int,
    password_ref: str | None,
    rules: IntakeRules | None,
    metadata: dict | None,
    idempotency_key: str | None,
    tenant: str | None = None,
) -> IngestResult:
    rules = rules or IntakeRules()
    try:
        checked_key(idempotency_key)
        tenant = checked_tenant(tenant, rules.default_tenant)
        content_hash, size, head = _hash_file(path, rules.pdf.max_file_bytes)
    except (IntakeError, ValueError) as exc:
        return IngestResult(shown, "rejected", reason=str(exc))
    except OSError as exc:
        return IngestResult(shown, "rejected", reason=f"unreadable: {exc.strerror}")
    if size == 0:
        return IngestResult(shown, "rejected", reason="empty: zero-byte file")
    mime = detect_type(head, path)
    refused = rejection_reason(mime) or _content_problem(path, mime, size, rules)
    if refused:
        return IngestResult(shown, "rejected", reason=refused)
    # per tenant, so deleting one tenant's file never takes another's copy of the same bytes
    storage_key = f"{tenant_storage_prefix(tenant)}/{content_hash[:2]}/{content_hash}{EXTENSIONS[mime]}"
    if not storage.exists(storage_key):
        storage.put_file(storage_key, path)
    # a known path with new content is a new version: it replaces the old one once fully indexed
    previous = previous_version(queue, source_path, content_hash, tenant) if source_path else None
    try:
        document, created = queue.register_document(
            filename=name,
            content_hash=content_hash,
            size_bytes=size,
            storage_key=storage_key,
            source_path=source_path,
            priority=priority,
            password_ref=password_ref,
            mime_type=mime,
            filename_bytes=os.fsencode(name),
            metadata=metadata,
            idempotency_key=idempotency_key,
            tenant=tenant,
        )
    except IdempotencyConflict as exc:
        return IngestResult(shown, "rejected", reason=str(exc))
    if created and previous is not None:
        mark_supersedes(queue, str(document["id"]), previous["id"])
        return IngestResult(
            shown,
            "new-version",
            str(document["id"]),
            document["document_key"],
            reason=f"replaces {previous['document_key']} once indexed",
        )
    if not created and _moved_from(document.get("source_path"), source_path):
        move_source(queue, str(document["id"]), source_path)
        return IngestResult(
            shown,
            "duplicate",
            str(document["id"]),
            document["document_key"],
            reason=f"moved from {document['source_path']}",
        )
    return IngestResult(shown, "new" if created else "duplicate", str(document["id"]), document["document_key"])


def _moved_from(known: str | None, source_path: str) -> bool:
    """The same bytes at a new local path while the file is gone from its known one: a rename, not a copy."""
    if not known or known == source_path_text(source_path) or "://" in known:
        return False  # an object store's old key cannot be checked from here
    return not os.path.lexists(known)


def _content_problem(path: Path, mime: str, size: int, rules: IntakeRules) -> str | None:
    """Why a file of a supported type is refused before it is stored (past a size bound), or None."""
    text_limit = rules.text.max_bytes
    if (mime in TEXT_TYPES or mime == CSV_MIME) and size > text_limit:
        return f"too large: text of more than {text_limit / (1 << 20):g} MB (DOCQUEUE_MAX_TEXT_MB)"
    if mime in ZIPPED_TYPES:
        return archive_problem(path, rules.office)
    return None


def ingest_paths(
    queue: TaskQueue,
    storage: LocalStorage,
    paths: Iterable[str | Path],
    *,
    priority: int = 0,
    password_ref: str | None = None,
    root: Path | None = None,
    idempotency_key: str | None = None,
    tenant: str | None = None,
    rules: IntakeRules | None = None,
) -> list[IngestResult]:
    """Register every readable file under `paths`, held to the entry point's `rules` (the defaults when not
    given)."""
    rules = rules or IntakeRules()
    return [
        ingest_file(
            queue,
            storage,
            p,
            priority=priority,
            password_ref=password_ref,
            rules=rules,
            idempotency_key=idempotency_key,
            tenant=tenant,
        )
        for p in iter_files(paths, root)
    ]
