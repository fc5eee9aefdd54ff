"""A drawing sheet's wide table through the real text layer (PyMuPDF + pymupdf4llm in the worker process) and the
real chunker: no chunk past its maximum, no synthetic column names, every cell's text in some chunk."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from processing.chunking import chunk_markdown
from processing.tokenizer import count_tokens
from resources.ocr import PdfLimits, PdfProcessor
from tests import pdf_factory as factory

COLUMNS = 28
NOTES = " ".join(f"Note {n}: anchor the steel frame to the slab with {n + 2} bolts per plate." for n in range(20))
SPEC = " ".join(f"Spec{n}" for n in range(12))


def _rows(header: list[str]) -> list[list[str]]:
    body = [[f"D{r:02d}-{c:02d} frame" for c in range(COLUMNS)] for r in range(6)]
    body[0][COLUMNS - 1] = body[1][COLUMNS - 1] = NOTES  # two rows far longer than a chunk
    body[2][3] = SPEC
    return [header, *body]


def _plain(text: str) -> str:
    """Text without layout: pymupdf4llm's <br> line breaks, table borders, dashes and whitespace."""
    return re.sub(r"<br>|[\s|-]", "", text)


def _body(chunk_text: str) -> str:
    """A chunk's lines without the header lines a split table repeats (a line above a |---| separator)."""
    lines = chunk_text.splitlines()
    separators = {i for i, line in enumerate(lines) if re.fullmatch(r"\|(?:-+\|)+", line)}
    return "\n".join(line for i, line in enumerate(lines) if i not in separators and i + 1 not in separators)


@pytest.fixture(scope="module")
def processor():
    with PdfProcessor(PdfLimits()) as shared:
        yield shared


@pytest.mark.parametrize(
    "header, named",
    [
        ([""] * COLUMNS, False),  # a table without a header: pymupdf4llm names every column ColN
        (["Mark", "Type"] + [""] * (COLUMNS - 3) + ["Remarks"], True),
    ],
)
def test_a_wide_table_is_chunked_within_bounds_and_keeps_every_cell(processor, tmp_path: Path, header, named):
    rows = _rows(header)
    pdf = factory.wide_table_pdf(tmp_path, "sheet.pdf", rows)
    page = processor.convert_page(pdf, 1)
    assert page.method == "text-layer"
    markdown = page.markdown
    assert "|Col1|" in markdown or "|Col3|" in markdown, "the text layer no longer invents column names"
    table_lines = [line for line in markdown.splitlines() if line.startswith("|")]
    assert max(count_tokens(line) for line in table_lines) > 400, "the table has no row longer than a chunk"

    chunks = chunk_markdown(markdown, page_key="sheet/p0001")
    assert max(chunk.token_count for chunk in chunks) <= 400
    assert not any(re.search(r"\|Col\d+\|", chunk.text) for chunk in chunks)
    chunk_text = "".join(_plain(_body(chunk.text)) for chunk in chunks)
    for row in rows:
        for cell in row:
            if cell:
                assert _plain(cell) in chunk_text, f"cell text missing: {cell[:60]!r}"
    if named:  # a split row's pieces repeat the names of their own columns
        notes_pieces = [chunk.text for chunk in chunks if "Note 7" in chunk.text or "Note 15" in chunk.text]
        assert notes_pieces and all(piece.startswith("|Remarks|\n|---|") for piece in notes_pieces)
