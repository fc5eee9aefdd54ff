"""Registering files as documents: content-addressed storage, idempotent on the bytes, type from content.

Shared by `docqueue ingest`, the inbox sensor and the object-store intake. Files are copied into storage under
their sha256, so the same bytes twice are one document and one file can never overwrite another's.

The type comes from the content, never from the name: PDF; PNG, JPEG and TIFF images (OCR); EPUB and XPS
(laid out by PyMuPDF); plain text, Markdown and HTML; DOCX, XLSX and CSV (page markdown without OCR). Anything
else is rejected here, with what it looks like, and nothing is registered.
"""
from __future__ import annotations

import codecs
import hashlib
import os
import re
import stat
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from queue_db.idempotency import IdempotencyConflict, checked_key
from queue_db.lifecycle import mark_supersedes, move_source, previous_version
from queue_db.queue import TaskQueue, source_path_text
from resources.ocr import PdfLimits
from resources.storage import LocalStorage
from orchestration.office_pages import (CSV_MIME, DOCX_MIME, OFFICE_TYPES, XLSX_MIME, ZIPPED_TYPES, OfficeLimits,
                                         archive_problem, csv_delimiter, office_zip_type)
from processing.text_pages import TEXT_TYPES, TextLimits

PDF_MAGIC = b"%PDF-"
EPUB_MIME = "application/epub+zip"
XPS_MIME = "application/vnd.ms-xpsdocument"
# mime -> PyMuPDF's file type, for everything the OCR worker opens
PYMUPDF_TYPES = {"application/pdf": "pdf", "image/png": "png", "image/jpeg": "jpeg", "image/tiff": "tiff",
                 EPUB_MIME: "epub", XPS_MIME: "xps"}
SUPPORTED_TYPES = frozenset(PYMUPDF_TYPES) | frozenset(TEXT_TYPES) | frozenset(OFFICE_TYPES)
_EXTENSIONS = {"application/pdf": ".pdf", "image/png": ".png", "image/jpeg": ".jpg", "image/tiff": ".tiff",
               EPUB_MIME: ".epub", XPS_MIME: ".xps", "text/plain": ".txt", "text/markdown": ".md",
               "text/html": ".html", DOCX_MIME: ".docx", XLSX_MIME: ".xlsx", CSV_MIME: ".csv"}
# what a rejected file looks like, for the reason shown to the user
_DESCRIPTIONS = {
    "application/zip": "a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX)",
    "application/x-executable": "an executable program (ELF)",
    "application/vnd.microsoft.portable-executable": "an executable program (Windows)",
    "application/x-mach-binary": "an executable program (Mach-O)",
    "application/gzip": "a gzip archive", "application/x-bzip2": "a bzip2 archive", "application/x-xz": "an xz archive",
    "application/x-7z-compressed": "a 7-Zip archive", "application/vnd.rar": "a RAR archive",
    "application/x-tar": "a tar archive",
    "image/gif": "a GIF image", "image/bmp": "a BMP image", "image/webp": "a WebP image",
    "application/xml": "XML that is not HTML", "image/svg+xml": "an SVG drawing",
    "application/vnd.openxmlformats-officedocument": "an Office Open XML document other than DOCX or XLSX "
                                                     "(convert it to PDF first)",
    "application/vnd.oasis.opendocument": "an OpenDocument file (convert it to PDF first)",
    "application/x-ole-storage": "a legacy Office document (save it as DOCX or XLSX, or convert it to PDF)",
    "application/octet-stream": "unrecognised binary data",
}
_BINARY_SIGNATURES = (
    (b"\x7fELF", "application/x-executable"), (b"MZ", "application/vnd.microsoft.portable-executable"),
    (b"\xfe\xed\xfa\xce", "application/x-mach-binary"), (b"\xfe\xed\xfa\xcf", "application/x-mach-binary"),
    (b"\xce\xfa\xed\xfe", "application/x-mach-binary"), (b"\xcf\xfa\xed\xfe", "application/x-mach-binary"),
    (b"\xca\xfe\xba\xbe", "application/x-mach-binary"),
    (b"\x1f\x8b", "application/gzip"), (b"BZh", "application/x-bzip2"), (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"), (b"Rar!\x1a\x07", "application/vnd.rar"),
    (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"), (b"BM", "image/bmp"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "application/x-ole-storage"),
)
_MARKUP_START = re.compile(r"\A\s*<")
_HTML_TAG = re.compile(r"<(!doctype\s+html|html|head|body|p|div|h[1-6]|ul|ol|table|section|article|main|title|meta)"
                       r"[\s>/]", re.IGNORECASE)
_MARKDOWN_SIGNS = (
    re.compile(r"^#{1,6}\s+\S", re.MULTILINE),  # ATX heading
    re.compile(r"^\s{0,3}(?:[-*+]|\d{1,3}[.)])\s+\S", re.MULTILINE),  # list item
    re.compile(r"^\s{0,3}(?:```|~~~)", re.MULTILINE),  # fenced code
    re.compile(r"\[[^\]\n]+\]\([^)\s]+\)"),  # link
    re.compile(r"(?:\*\*|__)[^*_\n]+(?:\*\*|__)"),  # strong emphasis
    re.compile(r"^\S[^\n]*\n(?:=+|-+)[ \t]*$", re.MULTILINE),  # setext heading
    re.compile(r"^\s{0,3}>\s", re.MULTILINE),  # block quote
    re.compile(r"^\|.*\|[ \t]*$", re.MULTILINE),  # table row
)
_TEXT_CONTROLS = frozenset("\t\n\r\f\v\x1b")


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


def detect_type(head: bytes, path: Path | None = None) -> str:
    """The mime type of a file from its first bytes (2 KiB are plenty), never from its name. A ZIP is told
    apart (EPUB, XPS, DOCX, XLSX, other Office, plain archive) from its directory when `path` is given, else
    from its first entry. PDF readers accept the header anywhere in the first KiB, so that is checked first."""
    if PDF_MAGIC in head[:1024]:
        return "application/pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "image/tiff"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_type(head, path)
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    if len(head) > 262 and head[257:262] == b"ustar":
        return "application/x-tar"
    for signature, mime in _BINARY_SIGNATURES:
        if head.startswith(signature):
            return mime
    text = _as_text(head)
    if text is None:
        return "application/octet-stream"
    return _text_type(text)


def rejection_reason(mime: str) -> str | None:
    """None for a type the pipeline reads, else why it is refused."""
    if mime in SUPPORTED_TYPES:
        return None
    family = next((d for m, d in _DESCRIPTIONS.items() if mime.startswith(m)), "a file type docqueue does not read")
    return f"unsupported: {family} (detected: {mime})"


def _zip_type(head: bytes, path: Path | None) -> str:
    if path is None:
        # EPUB requires `mimetype` as the first, stored entry: its name and content sit right after the header
        return EPUB_MIME if head[30:38] == b"mimetype" and EPUB_MIME.encode() in head[38:80] else "application/zip"
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.lower(): name for name in archive.namelist()}
            if "mimetype" in names:
                with archive.open(names["mimetype"]) as handle:
                    declared = handle.read(100).strip().decode("ascii", errors="replace")
                if declared == EPUB_MIME:
                    return EPUB_MIME
                if declared.startswith("application/vnd.oasis.opendocument"):
                    return declared
            if "[content_types].xml" in names:
                if any(n.endswith((".fdseq", ".fpage")) for n in names):
                    return XPS_MIME
                return office_zip_type(archive, names) or "application/vnd.openxmlformats-officedocument"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError):
        pass  # damaged or encrypted: a plain ZIP as far as anyone can tell
    return "application/zip"


def _as_text(head: bytes) -> str | None:
    """The head decoded as text, or None when it looks binary (NUL bytes, control characters)."""
    for bom, codec in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                       (codecs.BOM_UTF16_BE, "utf-16-be")):
        if head.startswith(bom):
            body = head[len(bom):]
            text = codecs.getincrementaldecoder(codec)(errors="replace").decode(body, final=False)
            return text if _mostly_printable(text) else None
    if b"\x00" in head:
        return None
    try:
        # a multi-byte character cut at the end of the head is not an error
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        text = head.decode("cp1252", errors="replace")
    return text if _mostly_printable(text) else None


def _mostly_printable(text: str) -> bool:
    if not text.strip():
        return bool(text)  # whitespace only is text (an empty document, refused later for having no pages)
    odd = sum(1 for c in text if (unicodedata.category(c) == "Cc" and c not in _TEXT_CONTROLS) or c == "\ufffd")
    return odd <= max(1, len(text) // 100)


def _text_type(text: str) -> str:
    stripped = text.lstrip()
    if _MARKUP_START.match(text):
        if _HTML_TAG.search(stripped[:2048]):
            return "text/html"
        if re.match(r"<svg[\s>]", stripped, re.IGNORECASE) or "<svg" in stripped[:512].lower():
            return "image/svg+xml"
        if stripped.startswith("<?xml") or re.match(r"<[A-Za-z_][\w.:-]*[\s>]", stripped):
            return "application/xml"
    if csv_delimiter(text):
        return CSV_MIME
    signs = [pattern for pattern in _MARKDOWN_SIGNS if pattern.search(text)]
    if _MARKDOWN_SIGNS[0] in signs or len(signs) >= 2:
        return "text/markdown"
    return "text/plain"


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
                head += chunk[:2048 - len(head)]
            size += len(chunk)
            if size > limit:
                raise IntakeError(too_large(limit))
            digest.update(chunk)
    return digest.hexdigest(), size, head


def ingest_file(queue: TaskQueue, storage: LocalStorage, path: Path, *, priority: int = 0,
                password_ref: str | None = None, limits: PdfLimits | None = None,
                source_path: str | None = None, name: str | None = None,
                metadata: dict | None = None, idempotency_key: str | None = None) -> IngestResult:
    """Register one file. `source_path` and `name` override where it came from (an object store downloads to a
    temporary file); a known source path with new content is a new version. With `idempotency_key`, the key
    names the document: the same key again is a duplicate, the key with other bytes is rejected."""
    return _register(queue, storage, path, shown=source_path or os.fsdecode(path), name=name or path.name,
                     source_path=source_path or os.fsdecode(path.resolve()), priority=priority,
                     password_ref=password_ref, limits=limits, metadata=metadata, idempotency_key=idempotency_key)


def ingest_stream(queue: TaskQueue, storage: LocalStorage, stream: BinaryIO, name: str, *, scratch: Path,
                  priority: int = 0, idempotency_key: str | None = None) -> IngestResult:
    """Register content read from a stream (standard input) under `name`, bounded by DOCQUEUE_MAX_FILE_MB while
    it is read. It has no source path, so it is never a new version of anything: the bytes (or the idempotency
    key) identify it."""
    limits = PdfLimits.from_env()
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
        return _register(queue, storage, path, shown=shown, name=name, source_path=None, priority=priority,
                         password_ref=None, limits=limits, metadata=None, idempotency_key=idempotency_key)


def _register(queue: TaskQueue, storage: LocalStorage, path: Path, *, shown: str, name: str,
              source_path: str | None, priority: int, password_ref: str | None, limits: PdfLimits | None,
              metadata: dict | None, idempotency_key: str | None) -> IngestResult:
    limits = limits or PdfLimits.from_env()
    try:
        checked_key(idempotency_key)
        content_hash, size, head = _hash_file(path, limits.max_file_bytes)
    except (IntakeError, ValueError) as exc:
        return IngestResult(shown, "rejected", reason=str(exc))
    except OSError as exc:
        return IngestResult(shown, "rejected", reason=f"unreadable: {exc.strerror}")
    if size == 0:
        return IngestResult(shown, "rejected", reason="empty: zero-byte file")
    mime = detect_type(head, path)
    refused = rejection_reason(mime) or _content_problem(path, mime, size)
    if refused:
        return IngestResult(shown, "rejected", reason=refused)
    storage_key = f"documents/{content_hash[:2]}/{content_hash}{_EXTENSIONS[mime]}"
    if not storage.exists(storage_key):
        storage.put_file(storage_key, path)
    # a known path with new content is a new version: it replaces the old one once fully indexed
    previous = previous_version(queue, source_path, content_hash) if source_path else None
    try:
        document, created = queue.register_document(
            filename=name, content_hash=content_hash, size_bytes=size, storage_key=storage_key,
            source_path=source_path, priority=priority, password_ref=password_ref, mime_type=mime,
            filename_bytes=os.fsencode(name), metadata=metadata, idempotency_key=idempotency_key)
    except IdempotencyConflict as exc:
        return IngestResult(shown, "rejected", reason=str(exc))
    if created and previous is not None:
        mark_supersedes(queue, str(document["id"]), previous["id"])
        return IngestResult(shown, "new-version", str(document["id"]), document["document_key"],
                            reason=f"replaces {previous['document_key']} once indexed")
    if not created and _moved_from(document.get("source_path"), source_path):
        move_source(queue, str(document["id"]), source_path)
        return IngestResult(shown, "duplicate", str(document["id"]), document["document_key"],
                            reason=f"moved from {document['source_path']}")
    return IngestResult(shown, "new" if created else "duplicate", str(document["id"]), document["document_key"])


def _moved_from(known: str | None, source_path: str) -> bool:
    """The same bytes at a new local path while the file is gone from its known one: a rename, not a copy."""
    if not known or known == source_path_text(source_path) or "://" in known:
        return False  # an object store's old key cannot be checked from here
    return not os.path.lexists(known)
def _content_problem(path: Path, mime: str, size: int) -> str | None:
    """Why a file of a supported type is refused before it is stored (past a size bound), or None."""
    text_limit = TextLimits.from_env().max_bytes
    if (mime in TEXT_TYPES or mime == CSV_MIME) and size > text_limit:
        return f"too large: text of more than {text_limit / (1 << 20):g} MB (DOCQUEUE_MAX_TEXT_MB)"
    if mime in ZIPPED_TYPES:
        return archive_problem(path, OfficeLimits.from_env())
    return None


def ingest_paths(queue: TaskQueue, storage: LocalStorage, paths: Iterable[str | Path], *, priority: int = 0,
                 password_ref: str | None = None, root: Path | None = None,
                 idempotency_key: str | None = None) -> list[IngestResult]:
    limits = PdfLimits.from_env()
    return [ingest_file(queue, storage, p, priority=priority, password_ref=password_ref, limits=limits,
                        idempotency_key=idempotency_key)
            for p in iter_files(paths, root)]
