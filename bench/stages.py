"""Throughput of each processing stage on this machine, side by side in one run.

pages/s for text-layer markdown and for OCR (RapidOCR), chunks/s for chunking, embedding (MiniLM int8 ONNX)
and extraction (spaCy), plus graph writes (embedded Bolt server). The inputs are generated: text pages with
headings, lists and tables; scanned pages rendered from known text. Ends with one line `RESULT {json}`.

    .venv/bin/python bench/stages.py [--text-pages 40] [--scanned-pages 6]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._result import print_result  # noqa: E402
from tests import pdf_factory as pf  # noqa: E402

PARAGRAPH = (
    "The committee in Geneva reviewed the annual figures of the Northern Railway Company, whose director "
    "Anna Keller presented the new timetable. Passenger numbers between Zurich and Milan rose by twelve "
    "percent, while freight volumes to Rotterdam remained stable. "
)


def text_pages(n: int) -> list[list[str]]:
    return [
        [
            f"# Chapter {i}",
            PARAGRAPH * 3,
            "## Figures",
            "- first item\n- second item\n- third item",
            "|Route|Trains|Delay|\n|Zurich-Milan|42|3.1|\n|Basel-Paris|30|2.4|",
            PARAGRAPH * 2,
        ]
        for i in range(1, n + 1)
    ]


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-pages", type=int, default=40)
    parser.add_argument("--scanned-pages", type=int, default=6)
    args = parser.parse_args()

    from processing.chunking import chunk_markdown
    from resources.embeddings import get_embedder
    from resources.extraction import SpacyExtractor
    from resources.ocr import PdfProcessor

    results: dict = {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    # the generated PDFs are gone when the bench ends: the test suite runs it on every pass
    with tempfile.TemporaryDirectory(prefix="docqueue-bench-stages-") as workdir, PdfProcessor() as pdf:
        text_pdf = pf.text_pdf(Path(workdir), "text.pdf", text_pages(args.text_pages), header="Railway Review")
        scanned = [pf.scanned_pdf(Path(workdir), f"scan{i}.pdf")[0] for i in range(args.scanned_pages)]
        info = pdf.inspect(text_pdf)
        pdf.convert_page(text_pdf, 1, boilerplate=info.boilerplate)  # warm the worker process
        pages, seconds = timed(
            lambda: [pdf.convert_page(text_pdf, n, boilerplate=info.boilerplate) for n in range(1, info.page_count + 1)]
        )
        results["text_layer_pages_per_s"] = round(len(pages) / seconds, 2)
        ocr_pages, ocr_seconds = timed(lambda: [pdf.convert_page(p, 1) for p in scanned])
        results["ocr_pages_per_s"] = round(len(ocr_pages) / ocr_seconds, 3)
        results["ocr_methods"] = sorted({p.method for p in ocr_pages})

    markdown = [p.markdown for p in pages]
    chunks, chunk_seconds = timed(
        lambda: [c for i, md in enumerate(markdown) for c in chunk_markdown(md, page_key=f"bench/p{i:04d}")]
    )
    results["chunks"] = len(chunks)
    results["chunking_chunks_per_s"] = round(len(chunks) / chunk_seconds, 1)
    texts = [c.text for c in chunks]

    embedder = get_embedder()
    embedder.embed(texts[:4])  # load the model before timing
    _, embed_seconds = timed(lambda: embedder.embed(texts))
    results["embedding_chunks_per_s"] = round(len(texts) / embed_seconds, 2)

    extractor = SpacyExtractor()
    extractor.extract(texts[:2])
    extractions, extract_seconds = timed(lambda: extractor.extract(texts))
    results["extraction_chunks_per_s"] = round(len(texts) / extract_seconds, 2)
    results["entities_per_chunk"] = round(sum(len(e.entities) for e in extractions) / len(texts), 2)

    results["ratio_text_layer_over_ocr"] = round(results["text_layer_pages_per_s"] / results["ocr_pages_per_s"], 1)
    results["ratio_extraction_over_embedding"] = round(
        results["extraction_chunks_per_s"] / results["embedding_chunks_per_s"], 2
    )
    results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    for key, value in results.items():
        print(f"{key:>34}: {value}")
    print_result(results, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
