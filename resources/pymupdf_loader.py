"""PyMuPDF as docqueue imports it: without its layout package. pymupdf 2 requires `pymupdf_layout` and imports it from
its own `__init__`, and that import loads an ONNX layout model and its runtime that docqueue never uses (it converts
with `pymupdf4llm.use_layout(False)`): 0.3 s of every process that opens a PDF. Blocked (None in sys.modules), the
import fails as for a missing package, which pymupdf and pymupdf4llm both handle. Every module of docqueue imports
PyMuPDF from here (`tests/unit/test_pdf_worker_imports.py` keeps it so)."""

from __future__ import annotations

import sys

sys.modules.setdefault("pymupdf.layout", None)  # type: ignore[arg-type]

import pymupdf  # noqa: E402  (after the block above, by design)

pymupdf.no_recommend_layout()  # no "consider the layout package" printed on stdout

__all__ = ["pymupdf"]
