"""A document's pages for the OCR phase: PDFs, images, EPUB and XPS are opened by the OCR worker; text, Markdown,
HTML and office files are read into markdown pages here, without OCR.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from processing.content_types import PYMUPDF_TYPES
from processing.office_pages import OFFICE_TYPES, OfficeLimits, office_pages
from processing.text_pages import TEXT_TYPES, TextLimits, UnreadableMarkup, document_pages
from resources.ocr import DocumentError, DocumentInfo, PageResult, PdfLimits

# mime -> page method of the documents whose pages are markdown made here, without OCR
MARKDOWN_PAGE_TYPES = {**TEXT_TYPES, **OFFICE_TYPES}


class PasswordError(RuntimeError):
    pass


def resolve_password(ref: str | None) -> str | None:
    """A password reference, never the password itself, is stored: `file:/path` or `env:NAME`."""
    if not ref:
        return None
    scheme, _, value = ref.partition(":")
    if scheme == "file":
        try:
            return Path(value).read_text(encoding="utf-8").strip("\r\n")
        except OSError as exc:
            raise PasswordError(f"password file unreadable: {exc.strerror}") from None
    if scheme == "env":
        if value not in os.environ:
            raise PasswordError(f"password variable {value} is not set")
        return os.environ[value]
    raise PasswordError("unknown password reference scheme (use file:PATH or env:NAME)")


class PageReader:
    """Opens a queued document (a row of the queue's documents) from storage and gives its page count or one page.

    `pdf` is the OCR worker's processor; a reader without one reads only the text and office types.
    """

    def __init__(self, storage, pdf, text: TextLimits, office: OfficeLimits):
        self.storage, self.pdf, self.text, self.office = storage, pdf, text, office
        self._cache: tuple[str, list[str]] | None = None  # (storage key@page bounds, pages) of the last one

    def inspect(self, document: dict) -> DocumentInfo:
        mime = document.get("mime_type") or "application/pdf"
        if mime in MARKDOWN_PAGE_TYPES:
            pages = self._text_pages(document)
            return DocumentInfo(
                page_count=len(pages),
                encrypted=False,
                repaired=False,
                metadata={"format": mime, "characters": sum(len(p) for p in pages)},
            )
        return self.pdf.inspect(
            self._document_file(document), resolve_password(document.get("password_ref")), filetype=_pymupdf_type(mime)
        )

    def convert_page(self, document: dict, page_number: int) -> PageResult:
        mime = document.get("mime_type") or "application/pdf"
        if mime not in MARKDOWN_PAGE_TYPES:
            return self.pdf.convert_page(
                self._document_file(document),
                page_number,
                resolve_password(document.get("password_ref")),
                boilerplate=tuple((document.get("metadata") or {}).get("boilerplate", ())),
                filetype=_pymupdf_type(mime),
            )
        started = time.perf_counter()
        pages = self._text_pages(document)
        if not 1 <= page_number <= len(pages):
            raise DocumentError(
                f"unsupported: page {page_number} does not exist (document has {len(pages)} pages)", "unsupported"
            )
        markdown = pages[page_number - 1]
        return PageResult(
            page_number, markdown, MARKDOWN_PAGE_TYPES[mime], len(markdown), time.perf_counter() - started
        )

    def _document_file(self, document: dict) -> Path:
        if not document.get("storage_key"):
            # only a document carried over from the legacy schema, which kept no files, lacks one
            raise DocumentError(
                "missing file: this document's file was never stored (it came from the legacy "
                "schema); re-ingest the original file",
                "missing_file",
                False,
            )
        return self.storage.local_path(document["storage_key"])

    def _text_pages(self, document: dict) -> list[str]:
        """The pages of a text or office document. The file is content-addressed, so its pages never change: the
        last document's are kept for the next page tasks of the batch instead of being read again for each."""
        limits, office = self.text, self.office
        key = f"{document['storage_key']}@{limits.page_chars}@{office.sheet_page_rows}"
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        path = self._document_file(document)
        if document["mime_type"] in OFFICE_TYPES:
            pages = office_pages(path, document["mime_type"], limits, office)
        elif path.stat().st_size > limits.max_bytes:
            raise DocumentError(
                f"too large: text of more than {limits.max_bytes / (1 << 20):g} MB (DOCQUEUE_MAX_TEXT_MB)", "too_large"
            )
        else:
            try:
                pages = document_pages(path.read_bytes(), document["mime_type"], limits)
            except UnreadableMarkup as exc:
                raise DocumentError(f"corrupt: {exc}", "corrupt") from None
        if not pages:
            raise DocumentError("empty: the text has no words", "empty")
        max_pages = (getattr(self.pdf, "limits", None) or PdfLimits()).max_pages
        if len(pages) > max_pages:
            raise DocumentError(
                f"too many pages: {len(pages)} > limit {max_pages} (pages of {limits.page_chars} characters)",
                "too_large",
            )
        self._cache = (key, pages)
        return pages


def _pymupdf_type(mime: str) -> str:
    if mime not in PYMUPDF_TYPES:
        raise DocumentError(f"unsupported: documents of type {mime} are not read", "unsupported")
    return PYMUPDF_TYPES[mime]
