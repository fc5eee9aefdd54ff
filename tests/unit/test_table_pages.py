"""How sheet and CSV rows are packed into table pages (processing/office_pages.py), as properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processing.office_pages import OfficeLimits, _table_pages
from processing.text_pages import TextLimits

cell = st.text(alphabet="ab |x", max_size=40)
row = st.lists(cell, min_size=1, max_size=12).filter(lambda r: r[-1] != "")  # trimmed, as they are read


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(row, min_size=1, max_size=60),
    page_chars=st.sampled_from([200, 400, 1000]),
    page_rows=st.integers(1, 20),
    sheet=st.sampled_from([None, "Sales", "A | B"]),
)
def test_pages_keep_every_row_in_order_within_their_bounds(rows, page_chars, page_rows, sheet):
    numbered = [(n, r) for n, r in enumerate(rows, start=1)]
    pages = _table_pages(
        iter(numbered), TextLimits(page_chars=page_chars), OfficeLimits(sheet_page_rows=page_rows), sheet
    )
    body_rows = []
    for page in pages:
        lines = page.split("\n")
        if sheet is not None:
            assert lines[0].startswith(f"## {sheet} (rows ") and lines[1] == ""
            lines = lines[2:]
        assert lines[1] == "|" + "---|" * (lines[1].count("|") - 1)  # the header's separator
        table_rows = lines[2:]
        assert len(table_rows) <= page_rows
        if len(table_rows) > 1:
            assert len(page) <= page_chars, page  # only a page of one row may pass the limit
        body_rows.extend(table_rows)
    assert len(body_rows) == len(rows) - 1  # the first row is every page's header, not a row of its own
    # cells are cut only when a row is longer than half a page; otherwise a row reads back as it was written
    for written, line in zip(rows[1:], body_rows):
        if "…" not in line:
            assert line.startswith("| " + " | ".join(c.replace("|", "\\|") for c in written) + " |")
        else:
            assert len(line) > 0 and any(len(c) > 8 for c in written)
