"""Word (DOCX), Excel (XLSX) and CSV documents as page markdown, without OCR.

Pages follow text_pages.py: a pure function of the bytes and the limits, so expansion (which counts the pages)
and each page task (which writes one page) agree without storing anything in between.

- DOCX: the body in order (headings, paragraphs, list items, tables as markdown tables) becomes markdown, then is
  split like text into pages of at most `DOCQUEUE_TEXT_PAGE_CHARS` characters; a table longer than a page is
  cut between rows first, every part repeating the header row.
- XLSX: every worksheet is a markdown table whose header is the sheet's first non-empty row. A sheet is one page
  or more, each of at most `DOCQUEUE_SHEET_PAGE_ROWS` rows and `DOCQUEUE_TEXT_PAGE_CHARS` characters, each
  headed `## <sheet> (rows a-b)` and repeating the header row. A formula cell shows the value Excel saved with it,
  or the formula itself when the file carries no saved value.
- CSV: the same table pages (without the sheet heading), delimiter `,` `;` or tab, ragged rows padded.

Bounds: `DOCQUEUE_MAX_UNZIPPED_MB` (what a DOCX or XLSX unpacks to), `DOCQUEUE_MAX_SHEETS`,
`DOCQUEUE_MAX_SHEET_ROWS` (non-empty rows of all sheets, or of the CSV), `DOCQUEUE_OFFICE_TIMEOUT` (seconds to
read one document), and the page limits shared with text.
"""

from __future__ import annotations

import csv
import datetime
import io
import itertools
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from processing.errors import DocumentError
from processing.text_pages import MB, TextLimits, decode_text, split_pages
from queue_db.config import StorageConfig, default

DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
CSV_MIME = "text/csv"
OFFICE_TYPES = {DOCX_MIME: "docx", XLSX_MIME: "xlsx", CSV_MIME: "csv"}  # mime -> page method
ZIPPED_TYPES = frozenset({DOCX_MIME, XLSX_MIME})
# the main part's content type in [Content_Types].xml, which is what Word and Excel themselves go by
MAIN_PART_TYPES = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml": DOCX_MIME,
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml": XLSX_MIME,
}
CSV_DELIMITERS = (",", ";", "\t")
_MIN_CELL_CHARS = 8
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # control characters in a cell become spaces


@dataclass(frozen=True)
class OfficeLimits:
    sheet_page_rows: int = default(StorageConfig, "sheet_page_rows")
    max_rows: int = default(StorageConfig, "max_sheet_rows")
    max_sheets: int = default(StorageConfig, "max_sheets")
    max_unzipped_bytes: int = int(default(StorageConfig, "max_unzipped_mb") * MB)
    timeout_s: float = default(StorageConfig, "office_timeout_s")

    def __post_init__(self):
        for name, value in (
            ("DOCQUEUE_SHEET_PAGE_ROWS", self.sheet_page_rows),
            ("DOCQUEUE_MAX_SHEET_ROWS", self.max_rows),
            ("DOCQUEUE_MAX_SHEETS", self.max_sheets),
            ("DOCQUEUE_MAX_UNZIPPED_MB", self.max_unzipped_bytes),
            ("DOCQUEUE_OFFICE_TIMEOUT", self.timeout_s),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be greater than 0, got {value}")

    @classmethod
    def from_config(cls, storage: StorageConfig) -> "OfficeLimits":
        return cls(
            sheet_page_rows=storage.sheet_page_rows,
            max_rows=storage.max_sheet_rows,
            max_sheets=storage.max_sheets,
            max_unzipped_bytes=int(storage.max_unzipped_mb * MB),
            timeout_s=storage.office_timeout_s,
        )


_WHOLE_TABLES = OfficeLimits(sheet_page_rows=1 << 30)  # a Word table is cut by page length, not row count


class _Deadline:
    """Reading stops between rows or blocks once the document has taken longer than its time limit."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.ends = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.ends:
            raise DocumentError(
                f"timeout: reading the document took longer than {self.seconds:g} s (DOCQUEUE_OFFICE_TIMEOUT)",
                "timeout",
            )


# ------------------------------------------------------------------------------------------------ detection
def office_zip_type(archive: zipfile.ZipFile, names: dict[str, str]) -> str | None:
    """DOCX or XLSX from an Office Open XML package's declared main part, else None."""
    with archive.open(names["[content_types].xml"]) as handle:
        declared = handle.read(1 << 20).decode("utf-8", errors="replace")
    return next((mime for part, mime in MAIN_PART_TYPES.items() if part in declared), None)


def csv_delimiter(text: str) -> str | None:
    """The delimiter when `text` (the start of a file) reads as a table: at least two lines, no blank line between
    them, and two lines in three splitting into the same number (two or more) of fields. Prose has blank lines
    between paragraphs and commas in no steady count, so it stays text; so do lines of two clauses (one comma
    and a space in each, as in verse)."""
    lines = text.split("\n")
    if len(lines) > 1 and not text.endswith("\n"):
        lines = lines[:-1]  # the head may end inside a line
    lines = [line.rstrip("\r") for line in lines]
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) < 2 or any(not line.strip() for line in lines):
        return None
    best, best_share = None, 0.0
    for delimiter in CSV_DELIMITERS:
        try:
            counts = [len(row) for row in csv.reader(lines, delimiter=delimiter)]
        except csv.Error:
            continue
        if not counts:
            continue
        mode = max(set(counts), key=counts.count)
        share = counts.count(mode) / len(counts)
        if delimiter == "," and mode == 2 and sum(line.count(", ") for line in lines) >= len(lines):
            continue
        if mode >= 2 and share >= 2 / 3 and share > best_share:
            best, best_share = delimiter, share
    return best


def archive_problem(path: Path, limits: OfficeLimits) -> str | None:
    """Why a DOCX or XLSX must not be opened (it unpacks to too much), or None. Reads only the ZIP directory."""
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"corrupt: the ZIP container cannot be read ({exc})"
    if unpacked > limits.max_unzipped_bytes:
        return (
            f"too large: unpacks to {unpacked / MB:.1f} MB > limit {limits.max_unzipped_bytes / MB:g} MB "
            "(DOCQUEUE_MAX_UNZIPPED_MB)"
        )
    return None


# ------------------------------------------------------------------------------------------------ pages
def office_pages(path: Path, mime: str, text_limits: TextLimits, limits: OfficeLimits) -> list[str]:
    """The page markdown of a DOCX, XLSX or CSV document, in order. Raises DocumentError with one sentence."""
    deadline = _Deadline(limits.timeout_s)
    if mime == CSV_MIME:
        if path.stat().st_size > text_limits.max_bytes:
            raise DocumentError(
                f"too large: CSV of more than {text_limits.max_bytes / MB:g} MB (DOCQUEUE_MAX_TEXT_MB)", "too_large"
            )
        return csv_pages(path.read_bytes(), text_limits, limits, deadline)
    if mime not in ZIPPED_TYPES:
        raise ValueError(f"not an office type: {mime}")
    problem = archive_problem(path, limits)
    if problem:
        raise DocumentError(problem, problem.split(":", 1)[0])
    kind = "Word document" if mime == DOCX_MIME else "workbook"
    try:
        if mime == DOCX_MIME:
            return split_pages(docx_markdown(path, deadline, text_limits), text_limits.page_chars)
        return xlsx_pages(path, text_limits, limits, deadline)
    except DocumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure on a damaged file is the file's, said once
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DocumentError(f"corrupt: the {kind} cannot be read ({detail})", "corrupt") from None


def docx_markdown(path: Path, deadline: _Deadline, text_limits: TextLimits) -> str:
    """The body as markdown. A table longer than a page becomes several tables, each repeating the header row,
    so that splitting the text into pages never separates rows from their header."""
    import docx
    from docx.table import Table

    blocks: list[str] = []
    items: list[str] = []  # consecutive list items stay one block
    for element in docx.Document(str(path)).iter_inner_content():
        deadline.check()
        if isinstance(element, Table):
            rows = [[_cell_text(cell.text) for cell in row.cells] for row in element.rows]
            rows = [row for row in rows if any(row)]
            _list_or_paragraph(blocks, items, None)
            if rows:
                blocks.extend(_table_pages(iter(enumerate(rows, start=1)), text_limits, _WHOLE_TABLES, None))
            continue
        lines = [" ".join(line.split()) for line in element.text.split("\n")]
        text = "\n".join(line for line in lines if line)
        if not text:
            continue
        style = (element.style.name if element.style is not None else "") or ""
        level = _heading_level(style)
        if level:
            _list_or_paragraph(blocks, items, "#" * level + " " + text.replace("\n", " "))
        elif style.startswith(("List Bullet", "List Number", "List Paragraph")) or _numbered(element):
            marker = "1. " if style.startswith("List Number") else "- "
            items.append(marker + text.replace("\n", " "))
        else:
            _list_or_paragraph(blocks, items, text)
    _list_or_paragraph(blocks, items, None)
    return "\n\n".join(blocks)


def _list_or_paragraph(blocks: list[str], items: list[str], paragraph: str | None) -> None:
    """Close the open list (if any), then add the paragraph (if any)."""
    if items:
        blocks.append("\n".join(items))
        items.clear()
    if paragraph:
        blocks.append(paragraph)


def _heading_level(style: str) -> int:
    if style == "Title":
        return 1
    if style.startswith("Heading "):
        number = style[len("Heading ") :]
        return min(int(number), 6) if number.isdigit() and int(number) > 0 else 0
    return 0


def _numbered(paragraph) -> bool:
    properties = paragraph._p.pPr
    return properties is not None and properties.numPr is not None


def xlsx_pages(path: Path, text_limits: TextLimits, limits: OfficeLimits, deadline: _Deadline) -> list[str]:
    import openpyxl

    # two streaming passes over the same cells: saved values, and formulas for cells that have no saved value
    values = openpyxl.load_workbook(str(path), read_only=True, data_only=True)
    formulas = openpyxl.load_workbook(str(path), read_only=True, data_only=False)
    try:
        sheets = values.worksheets
        if len(sheets) > limits.max_sheets:
            raise DocumentError(
                f"too large: {len(sheets)} sheets > limit {limits.max_sheets} (DOCQUEUE_MAX_SHEETS)", "too_large"
            )
        pages: list[str] = []
        budget = _RowBudget(limits.max_rows)
        for sheet in sheets:
            deadline.check()
            rows = _sheet_rows(sheet, formulas[sheet.title])
            pages.extend(_table_pages(budget.counted(rows, deadline), text_limits, limits, sheet.title))
        return pages
    finally:
        values.close()
        formulas.close()


def _sheet_rows(values, formulas) -> Iterator[tuple[int, list[str]]]:
    """(row number, cell texts) of one sheet: the saved value of each cell, else what was written in it."""
    for sheet in (values, formulas):
        # the declared dimensions can claim 16,384 columns: rows are read as long as their last cell instead
        sheet.reset_dimensions()
    rows = itertools.zip_longest(values.iter_rows(values_only=True), formulas.iter_rows(values_only=True), fillvalue=())
    for number, (saved, written) in enumerate(rows, start=1):
        yield number, [_cell_text(v if v is not None else f) for v, f in itertools.zip_longest(saved, written)]


def csv_pages(data: bytes, text_limits: TextLimits, limits: OfficeLimits, deadline: _Deadline) -> list[str]:
    text = decode_text(data)
    delimiter = csv_delimiter(text[:4096]) or ","
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)

    def rows() -> Iterator[tuple[int, list[str]]]:
        try:
            for row in reader:
                yield reader.line_num, [_cell_text(value) for value in row]
        except csv.Error as exc:
            raise DocumentError(f"corrupt: CSV line {reader.line_num} cannot be read ({exc})", "corrupt") from None

    return _table_pages(_RowBudget(limits.max_rows).counted(rows(), deadline), text_limits, limits, None)


class _RowBudget:
    """Non-empty rows of one document, counted against DOCQUEUE_MAX_SHEET_ROWS as they are read."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def counted(self, rows: Iterable[tuple[int, list[str]]], deadline: _Deadline) -> Iterator[tuple[int, list[str]]]:
        for number, row in rows:
            deadline.check()
            while row and not row[-1]:
                row.pop()
            if not row:
                continue
            self.used += 1
            if self.used > self.limit:
                raise DocumentError(f"too large: more than {self.limit} rows (DOCQUEUE_MAX_SHEET_ROWS)", "too_large")
            yield number, row


def _table_pages(
    rows: Iterator[tuple[int, list[str]]], text_limits: TextLimits, limits: OfficeLimits, sheet: str | None
) -> list[str]:
    """Rows packed into pages of at most `sheet_page_rows` rows and `page_chars` characters (a page holds one row
    at least), each repeating the first row as the table's header. A page's rows are padded to its widest row,
    so its length is recounted whenever a wider row joins it."""
    first = next(rows, None)
    if first is None:
        return []
    header_number, header = first
    page_chars = text_limits.page_chars
    row_chars = page_chars // 2  # cells are cut so that a row takes at most half a page
    max_columns = page_chars // 16  # the |---| line under the header takes at most a quarter
    # the longest heading a page can get: row numbers of a spreadsheet have at most 7 digits
    heading_chars = len(_heading(sheet, 10**6, 10**6))
    pages: list[str] = []
    page: list[tuple[int, list[str]]] = []
    width = body_chars = 0

    def rows_chars(candidates: Iterable[list[str]], columns: int) -> int:
        return sum(len(_row_line(row, columns, row_chars)) + 1 for row in candidates)

    for number, row in itertools.chain([first], rows):
        if len(row) > max_columns:
            raise DocumentError(
                f"too large: row {number} has {len(row)} columns, more than a page of "
                f"{page_chars} characters holds ({max_columns}; DOCQUEUE_TEXT_PAGE_CHARS)",
                "too_large",
            )
        if number == header_number:
            continue
        wider = max(width, len(header), len(row))
        grown = rows_chars([r for _, r in page], wider) if wider != width else body_chars
        grown += rows_chars([row], wider)
        total = heading_chars + len(_row_line(header, wider, row_chars)) + 4 * wider + 2 + grown
        if page and (len(page) >= limits.sheet_page_rows or total > page_chars):
            pages.append(_table_page(sheet, header, page, row_chars))
            page.clear()
            wider = max(len(header), len(row))
            grown = rows_chars([row], wider)
        page.append((number, row))
        width, body_chars = wider, grown
    if page or not pages:
        pages.append(
            _table_page(sheet, header, page, row_chars)
            if page
            else _heading(sheet, header_number, header_number) + "\n".join(_table_lines(header, [], row_chars))
        )
    return pages


def _table_page(sheet: str | None, header: list[str], page: list[tuple[int, list[str]]], row_chars: int) -> str:
    return _heading(sheet, page[0][0], page[-1][0]) + "\n".join(
        _table_lines(header, [row for _, row in page], row_chars)
    )


def _heading(sheet: str | None, first_row: int, last_row: int) -> str:
    return "" if sheet is None else f"## {_cell_text(sheet)} (rows {first_row}-{last_row})\n\n"


def _table_lines(header: list[str], rows: list[list[str]], row_chars: int | None) -> list[str]:
    """A markdown table, every row padded to the widest; cells cut (with …) so no row passes `row_chars`."""
    width = max(len(row) for row in [header, *rows])
    lines = [_row_line(header, width, row_chars), "|" + "---|" * width]
    lines.extend(_row_line(row, width, row_chars) for row in rows)
    return lines


def _row_line(row: list[str], width: int, row_chars: int | None) -> str:
    cells = row + [""] * (width - len(row))
    line = _joined(cells)
    if row_chars is not None and len(line) > row_chars:
        cut = max(_MIN_CELL_CHARS, row_chars // width - 3)
        line = _joined([c if len(c) <= cut else c[: cut - 1] + "…" for c in cells])
    return line


def _joined(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        return value.date().isoformat()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return " ".join(_CONTROLS.sub(" ", str(value)).split())
