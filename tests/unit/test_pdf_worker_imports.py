"""The PDF worker's start (resources._pdf_worker._Worker) leaves PyMuPDF's layout package unloaded: docqueue converts
without it, and importing it loads an ONNX model. Run in a fresh interpreter, as the worker is."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from resources._pdf_worker import _Worker
_Worker({"threads": 1})
import pymupdf, pymupdf4llm
print(json.dumps({"layout_loaded": sys.modules.get("pymupdf.layout") is not None,
                  "use_layout": pymupdf4llm._use_layout, "get_layout": pymupdf._get_layout is not None}))
"""


def test_the_pdf_worker_starts_without_the_layout_model():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "layout_loaded": False,
        "use_layout": False,
        "get_layout": False,
    }
