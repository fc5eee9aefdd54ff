"""The limits a PDF is read within (size, pages, rendering, the worker's memory and time), from DOCQUEUE_MAX_FILE_MB,
DOCQUEUE_MAX_PAGES and their neighbours. Apart from the reader (resources/ocr.py) so that intake, which checks a
file against them, loads neither the reader's worker machinery nor multiprocessing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from queue_db.config import OCR_LANGUAGES_RULE, PDF_FALLBACKS, StorageConfig, default

MB = 1024 * 1024


@dataclass(frozen=True)
class PdfLimits:
    max_file_bytes: int = int(default(StorageConfig, "max_file_mb") * MB)
    max_pages: int = default(StorageConfig, "max_pages")
    max_render_pixels: int = default(StorageConfig, "max_render_pixels")
    page_timeout_s: float = default(StorageConfig, "page_timeout_s")
    max_memory_mb: int = default(StorageConfig, "worker_memory_mb")
    ocr_dpi: int = default(StorageConfig, "ocr_dpi")
    min_text_chars: int = default(StorageConfig, "min_text_chars")
    max_unmapped_share: float = default(StorageConfig, "max_unmapped_share")
    max_lookalike_share: float = default(StorageConfig, "max_lookalike_share")
    ocr_threads: int = default(StorageConfig, "ocr_threads")
    worker_start_timeout_s: float = default(StorageConfig, "worker_start_timeout_s")
    pdf_fallback: str = default(StorageConfig, "pdf_fallback")
    ocr_languages: str = default(StorageConfig, "ocr_languages")  # empty: RapidOCR; else Tesseract's `-l`

    def __post_init__(self):
        if self.pdf_fallback not in PDF_FALLBACKS:
            raise ValueError(f"PdfLimits.pdf_fallback must be one of {PDF_FALLBACKS}, got {self.pdf_fallback!r}")
        if self.ocr_languages and not OCR_LANGUAGES_RULE.fullmatch(self.ocr_languages):
            raise ValueError(f"PdfLimits.ocr_languages must be names joined by +, got {self.ocr_languages!r}")
        for item in dataclasses.fields(self):
            if item.name in ("pdf_fallback", "ocr_languages"):
                continue
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"PdfLimits.{item.name} must be a positive number, got {value!r}")

    @classmethod
    def from_config(cls, env: StorageConfig) -> "PdfLimits":
        """The limits DOCQUEUE_MAX_FILE_MB, DOCQUEUE_MAX_PAGES, ... set, from the entry point's settings."""
        return cls(
            max_file_bytes=int(env.max_file_mb * MB),
            max_pages=env.max_pages,
            max_render_pixels=env.max_render_pixels,
            page_timeout_s=env.page_timeout_s,
            max_memory_mb=env.worker_memory_mb,
            ocr_dpi=env.ocr_dpi,
            min_text_chars=env.min_text_chars,
            max_unmapped_share=env.max_unmapped_share,
            max_lookalike_share=env.max_lookalike_share,
            ocr_threads=env.ocr_threads,
            worker_start_timeout_s=env.worker_start_timeout_s,
            pdf_fallback=env.pdf_fallback,
            ocr_languages=env.ocr_languages,
        )

    def worker_settings(self) -> dict:
        return {
            "memory_mb": self.max_memory_mb,
            "threads": self.ocr_threads,
            "max_pages": self.max_pages,
            "ocr_dpi": self.ocr_dpi,
            "max_render_pixels": self.max_render_pixels,
            "min_text_chars": self.min_text_chars,
            "max_unmapped_share": self.max_unmapped_share,
            "max_lookalike_share": self.max_lookalike_share,
            "pdf_fallback": self.pdf_fallback,
            "ocr_languages": self.ocr_languages,
            "page_timeout_s": self.page_timeout_s,
        }
