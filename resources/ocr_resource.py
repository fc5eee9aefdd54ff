"""The OCR worker as a Dagster resource (resources/ocr.py holds the worker and its limits, free of Dagster, so the
CLI's intake checks a file's bounds without importing Dagster)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict
from typing import Optional

import dagster as dg
from pydantic import Field, PrivateAttr

from queue_db.config import Settings
from resources.ocr import MB, PdfLimits, PdfProcessor

# One PDF worker per process and set of limits, shared by the runs the process executes one after another: starting
# a worker (PyMuPDF and the OCR models) and stopping it cost a run seconds, more than a small run's work. The worker
# goes when the process exits (PdfProcessor's finalizer), or when a fifth set of limits pushes it out.
_SHARED_LIMIT = 4
_shared: OrderedDict[PdfLimits, PdfProcessor] = OrderedDict()
_shared_lock = threading.Lock()


def _forget_inherited_processors() -> None:
    # a forked child (a Celery prefork slot, a test's worker) starts its own worker on first use
    global _shared_lock
    _shared_lock = threading.Lock()
    for processor in _shared.values():
        processor.forget_inherited_worker()
    _shared.clear()


os.register_at_fork(after_in_child=_forget_inherited_processors)


def shared_processor(limits: PdfLimits) -> PdfProcessor:
    with _shared_lock:
        processor = _shared.get(limits)
        if processor is None:
            processor = _shared[limits] = PdfProcessor(limits)
            while len(_shared) > _SHARED_LIMIT:
                _, oldest = _shared.popitem(last=False)
                oldest.close()
        _shared.move_to_end(limits)
        return processor


def close_shared_processors() -> None:
    """Stop this process's PDF workers now, each waited for: a process that leaves through os._exit (a forked
    `docqueue run` worker) runs no finalizer, and a worker left to notice its parent's end on its own is nobody's
    child to wait for."""
    with _shared_lock:
        processors = list(_shared.values())
        _shared.clear()
    for processor in processors:
        processor.close()


class OcrResource(dg.ConfigurableResource):
    """Builds the PdfProcessor; the entry point fills the fields (`OcrResource.from_settings`), unset ones keep
    PdfLimits' defaults."""

    max_file_mb: Optional[float] = Field(default=None, description="DOCQUEUE_MAX_FILE_MB (200)")
    max_pages: Optional[int] = Field(default=None, description="DOCQUEUE_MAX_PAGES (2000)")
    max_render_pixels: Optional[int] = Field(default=None, description="DOCQUEUE_MAX_RENDER_PIXELS (25e6)")
    page_timeout_s: Optional[float] = Field(default=None, description="DOCQUEUE_PAGE_TIMEOUT (120)")
    max_memory_mb: Optional[int] = Field(default=None, description="DOCQUEUE_WORKER_MEMORY_MB (3072)")
    ocr_dpi: Optional[int] = Field(default=None, description="DOCQUEUE_OCR_DPI (200)")
    min_text_chars: Optional[int] = Field(default=None, description="DOCQUEUE_MIN_TEXT_CHARS (20)")
    max_unmapped_share: Optional[float] = Field(default=None, description="DOCQUEUE_MAX_UNMAPPED_SHARE (0.3)")
    max_lookalike_share: Optional[float] = Field(default=None, description="DOCQUEUE_MAX_LOOKALIKE_SHARE (0.2)")
    ocr_threads: Optional[int] = Field(default=None, description="DOCQUEUE_OCR_THREADS (2)")
    worker_start_timeout_s: Optional[float] = Field(default=None, description="DOCQUEUE_WORKER_START_TIMEOUT (60)")
    pdf_fallback: Optional[str] = Field(default=None, description="DOCQUEUE_PDF_FALLBACK (pdfium)")
    ocr_languages: Optional[str] = Field(default=None, description="DOCQUEUE_OCR_LANGUAGES (unset: RapidOCR)")

    @classmethod
    def from_settings(cls, settings: Settings) -> "OcrResource":
        storage = settings.storage
        return cls(
            max_file_mb=storage.max_file_mb,
            max_pages=storage.max_pages,
            max_render_pixels=storage.max_render_pixels,
            page_timeout_s=storage.page_timeout_s,
            max_memory_mb=storage.worker_memory_mb,
            ocr_dpi=storage.ocr_dpi,
            min_text_chars=storage.min_text_chars,
            max_unmapped_share=storage.max_unmapped_share,
            max_lookalike_share=storage.max_lookalike_share,
            ocr_threads=storage.ocr_threads,
            worker_start_timeout_s=storage.worker_start_timeout_s,
            pdf_fallback=storage.pdf_fallback,
            ocr_languages=storage.ocr_languages,
        )

    _processor: Optional[PdfProcessor] = PrivateAttr(default=None)

    def limits(self) -> PdfLimits:
        overrides = {
            name: getattr(self, name)
            for name in (
                "max_pages",
                "max_render_pixels",
                "page_timeout_s",
                "max_memory_mb",
                "ocr_dpi",
                "min_text_chars",
                "max_unmapped_share",
                "max_lookalike_share",
                "ocr_threads",
                "worker_start_timeout_s",
                "pdf_fallback",
                "ocr_languages",
            )
            if getattr(self, name) is not None
        }
        if self.max_file_mb is not None:
            overrides["max_file_bytes"] = int(self.max_file_mb * MB)
        return dataclasses.replace(PdfLimits(), **overrides)

    def get_processor(self) -> PdfProcessor:
        """The process's processor for these limits (one worker process), reused across calls and runs."""
        if self._processor is None:
            self._processor = shared_processor(self.limits())
        return self._processor

    def teardown_after_execution(self, context) -> None:
        # the worker stays for the process's next run (shared_processor); only this run's handle goes
        self._processor = None
