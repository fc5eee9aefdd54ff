"""PyMuPDF without its layout package (resources/pymupdf_loader.py): the PDF worker's start leaves the layout model
unloaded, since docqueue converts without it and importing it loads an ONNX model; and every docqueue module takes
PyMuPDF from the loader, so that no process loads the model by importing pymupdf first."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestration", "processing", "queue_db", "resources")
PROBE = """
import json, sys
from resources._pdf_worker import _Worker
_Worker({"threads": 1})
import pymupdf, pymupdf4llm
print(json.dumps({"layout_loaded": sys.modules.get("pymupdf.layout") is not None,
                  "use_layout": pymupdf4llm._use_layout, "get_layout": pymupdf._get_layout is not None}))
"""


def test_the_pdf_worker_starts_without_the_layout_model():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True, cwd=REPO
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "layout_loaded": False,
        "use_layout": False,
        "get_layout": False,
    }


def test_docqueue_imports_pymupdf_only_through_the_loader():
    direct = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "pymupdf_loader.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if "pymupdf" in names or module == "pymupdf" or (module or "").startswith("pymupdf."):
                    direct.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert direct == []
