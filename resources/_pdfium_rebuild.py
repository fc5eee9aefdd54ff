"""pdfium's second opinion on a PDF PyMuPDF cannot open or finds no pages in, run inside the PDF worker only.

pdfium (Chromium's PDF engine, through pypdfium2) reads page trees MuPDF gives up on: a /Count that says 0 or
less, a catalog whose /Pages names a page instead of a page tree. Its pages are imported into a new document with
a clean page tree, which is written to memory and handed back to PyMuPDF, so a recovered page goes through the
same text-layer, blank-page, render and OCR path, under the same bounds, as any other page. The worker's memory
cap and the parent's time limit hold pdfium too; the page limit is checked before any page is copied.

pypdfium2 is imported here, on the first document that needs it, never by the rest of docqueue.
"""

from __future__ import annotations

import io
from dataclasses import dataclass


class PdfiumFailure(Exception):
    """pdfium's verdict when it settles the document's fate itself: encrypted, or too many pages."""

    def __init__(self, error_class: str, reason: str):
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


class PdfiumUnreadable(Exception):
    """pdfium cannot read the document either; the message says why, in a few words."""


@dataclass(frozen=True)
class Rebuilt:
    data: bytes  # the pages pdfium read, as a new PDF
    page_count: int
    encrypted: bool  # the original had a security handler (opened with the document's password)


def rebuild(path: str, password: str | None, max_pages: int) -> Rebuilt:
    """The document's pages as pdfium reads them, in a PDF PyMuPDF can open."""
    import pypdfium2 as pdfium

    try:
        source = pdfium.PdfDocument(path, password=password)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium.raw.FPDF_ERR_PASSWORD:
            if password:
                raise PdfiumFailure("encrypted", "encrypted: wrong password") from None
            raise PdfiumFailure("encrypted", "encrypted: password required") from None
        raise PdfiumUnreadable(_cannot_open(pdfium, exc.err_code)) from None
    try:
        count = len(source)
        if count > max_pages:
            raise PdfiumFailure("too_large", f"too many pages: {count} > limit {max_pages}")
        if count == 0:
            raise PdfiumUnreadable("pdfium finds no pages either")
        encrypted = pdfium.raw.FPDF_GetSecurityHandlerRevision(source.raw) != -1
        return Rebuilt(_copy_pages(pdfium, source), count, encrypted)
    finally:
        source.close()


def _copy_pages(pdfium, source) -> bytes:
    target = pdfium.PdfDocument.new()
    try:
        try:
            target.import_pages(source)
        except pdfium.PdfiumError:
            # a page pdfium lists but cannot load (e.g. inside a page-tree cycle) stops the import as a whole
            raise PdfiumUnreadable("pdfium cannot copy its pages either") from None
        buffer = io.BytesIO()
        target.save(buffer)
        return buffer.getvalue()
    finally:
        target.close()


def _cannot_open(pdfium, code: int | None) -> str:
    raw = pdfium.raw
    why = {
        raw.FPDF_ERR_FORMAT: "data format error",
        raw.FPDF_ERR_FILE: "file not readable",
        raw.FPDF_ERR_SECURITY: "unsupported security handler",
    }.get(code)
    # pdfium reports no error code for some refusals (a catalog without a page tree): then none is named
    return f"pdfium cannot open it either ({why})" if why else "pdfium cannot open it either"
