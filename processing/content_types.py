"""What a file is, from its first bytes and never from its name, and whether docqueue reads that type."""

from __future__ import annotations

import codecs
import re
import unicodedata
import zipfile
from pathlib import Path

from processing.office_pages import CSV_MIME, DOCX_MIME, OFFICE_TYPES, XLSX_MIME, csv_delimiter, office_zip_type
from processing.text_pages import TEXT_TYPES

PDF_MAGIC = b"%PDF-"
EPUB_MIME = "application/epub+zip"
XPS_MIME = "application/vnd.ms-xpsdocument"
# mime -> PyMuPDF's file type, for everything the OCR worker opens
PYMUPDF_TYPES = {
    "application/pdf": "pdf",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/tiff": "tiff",
    EPUB_MIME: "epub",
    XPS_MIME: "xps",
}
SUPPORTED_TYPES = frozenset(PYMUPDF_TYPES) | frozenset(TEXT_TYPES) | frozenset(OFFICE_TYPES)
EXTENSIONS = {
    "application/pdf": ".pdf",
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/tiff": ".tiff",
    EPUB_MIME: ".epub",
    XPS_MIME: ".xps",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/html": ".html",
    DOCX_MIME: ".docx",
    XLSX_MIME: ".xlsx",
    CSV_MIME: ".csv",
}
# what a rejected file looks like, for the reason shown to the user
_DESCRIPTIONS = {
    "application/zip": "a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX)",
    "application/x-executable": "an executable program (ELF)",
    "application/vnd.microsoft.portable-executable": "an executable program (Windows)",
    "application/x-mach-binary": "an executable program (Mach-O)",
    "application/gzip": "a gzip archive",
    "application/x-bzip2": "a bzip2 archive",
    "application/x-xz": "an xz archive",
    "application/x-7z-compressed": "a 7-Zip archive",
    "application/vnd.rar": "a RAR archive",
    "application/x-tar": "a tar archive",
    "image/gif": "a GIF image",
    "image/bmp": "a BMP image",
    "image/webp": "a WebP image",
    "application/xml": "XML that is not HTML",
    "image/svg+xml": "an SVG drawing",
    "application/vnd.openxmlformats-officedocument": "an Office Open XML document other than DOCX or XLSX "
    "(convert it to PDF first)",
    "application/vnd.oasis.opendocument": "an OpenDocument file (convert it to PDF first)",
    "application/x-ole-storage": "a legacy Office document (save it as DOCX or XLSX, or convert it to PDF)",
    "application/octet-stream": "unrecognised binary data",
}
_BINARY_SIGNATURES = (
    (b"\x7fELF", "application/x-executable"),
    (b"MZ", "application/vnd.microsoft.portable-executable"),
    (b"\xfe\xed\xfa\xce", "application/x-mach-binary"),
    (b"\xfe\xed\xfa\xcf", "application/x-mach-binary"),
    (b"\xce\xfa\xed\xfe", "application/x-mach-binary"),
    (b"\xcf\xfa\xed\xfe", "application/x-mach-binary"),
    (b"\xca\xfe\xba\xbe", "application/x-mach-binary"),
    (b"\x1f\x8b", "application/gzip"),
    (b"BZh", "application/x-bzip2"),
    (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (b"Rar!\x1a\x07", "application/vnd.rar"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "application/x-ole-storage"),
)
_MARKUP_START = re.compile(r"\A\s*<")
_HTML_TAG = re.compile(
    r"<(!doctype\s+html|html|head|body|p|div|h[1-6]|ul|ol|table|section|article|main|title|meta)"
    r"[\s>/]",
    re.IGNORECASE,
)
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
    for bom, codec in (
        (codecs.BOM_UTF8, "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
    ):
        if head.startswith(bom):
            body = head[len(bom) :]
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
