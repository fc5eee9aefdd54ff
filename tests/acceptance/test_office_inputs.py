"""Word, Excel and CSV documents through intake and the real pipeline to chunks, and hostile ones: a ZIP dressed
as a DOCX, a DOCX whose body is not XML, a sheet past the row limit, a workbook that unpacks past its bound, a
CSV with ragged rows and binary junk. Every file is generated here with python-docx and openpyxl."""

from __future__ import annotations

import random
import re
import zipfile
from pathlib import Path

import docx
import openpyxl
import pytest

from queue_db.phases import Level
from tests.acceptance.test_input_types import TEXT_PAGE_CHARS as PAGE_CHARS  # noqa: F401
from tests.acceptance.test_input_types import pipeline_env  # noqa: F401 - a fixture, used by name

SHEET_PAGE_ROWS = 3
MAX_ROWS = 400
DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX_MIME = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PARAGRAPHS = [
    f"Section {n} of the harbour report: the pilots guided {n * 3} cargo ships through the channel "
    f"and logged the tides every hour."
    for n in range(1, 5)
]
DOCX_MARKDOWN = "\n\n".join(
    [
        "# Harbour Report",
        "# Traffic",
        *PARAGRAPHS[:2],
        "- Dredge the northern berth\n- Repaint the buoys",
        "| Berth | Ships |\n|---|---|\n| North \\| East | 12 |\n| South | 7 |",
        "# Outlook",
        *PARAGRAPHS[2:],
    ]
)
SALES = [("North", 120, 3.5), ("South", 80, 4.25), ("East", 95, 2.0), ("West", 60, 5.5), ("Centre", 30, 1.0)]
CSV_ROWS = 250  # past the 2 KiB that detection reads, so the junk after them is not in the head
CSV_TEXT = "station;reading;unit\nalpha;12;mm\nbeta;7\ngamma;9;mm;late\ndelta;3;mm\n" + "".join(
    f"s{n};{n};mm\n" for n in range(CSV_ROWS)
)


# -- generated inputs -------------------------------------------------------------------------------------------
def _report(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Harbour Report", 0)
    document.add_heading("Traffic", 1)
    for text in PARAGRAPHS[:2]:
        document.add_paragraph(text)
    document.add_paragraph("Dredge the northern berth", style="List Bullet")
    document.add_paragraph("Repaint the buoys", style="List Bullet")
    table = document.add_table(rows=3, cols=2)
    for row, values in zip(table.rows, [("Berth", "Ships"), ("North | East", "12"), ("South", "7")]):
        for cell, value in zip(row.cells, values):
            cell.text = value
    document.add_paragraph("   ")  # blank paragraphs leave nothing behind
    document.add_heading("Outlook", 1)
    for text in PARAGRAPHS[2:]:
        document.add_paragraph(text)
    document.save(path)
    return path


def _workbook(path: Path) -> Path:
    """Two sheets and an empty one. Openpyxl saves formulas without values, like a file no spreadsheet program
    has calculated; one formula gets a saved value written into the sheet XML, as Excel would save it."""
    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    sales.append(["Region", "Units", "Price"])
    for row in SALES:
        sales.append(list(row))
    sales.append([])  # an empty row is skipped
    sales.append(["Total", "=SUM(B2:B6)", "=AVERAGE(C2:C6)"])
    book.create_sheet("Empty")
    staff = book.create_sheet("Staff")
    staff.append(["Name", "Role"])
    staff.append(["Ada", "Pilot"])
    book.save(path)
    _with_saved_value(path, "xl/worksheets/sheet1.xml", "<f>SUM(B2:B6)</f><v></v>", "<f>SUM(B2:B6)</f><v>385</v>")
    return path


def _with_saved_value(path: Path, part: str, old: str, new: str) -> None:
    with zipfile.ZipFile(path) as source:
        parts = {info.filename: source.read(info) for info in source.infolist()}
    assert old.encode() in parts[part]
    parts[part] = parts[part].replace(old.encode(), new.encode())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for name, data in parts.items():
            target.writestr(name, data)


def _big_sheet(path: Path, rows: int) -> Path:
    book = openpyxl.Workbook(write_only=True)
    sheet = book.create_sheet("Log")
    sheet.append(["n", "square"])
    for n in range(rows):
        sheet.append([n, n * n])
    book.save(path)
    return path


def _docx_with_broken_body(path: Path) -> Path:
    """Word's package layout around a body that is not XML: detected as DOCX, unreadable as one."""
    _report(path)
    with zipfile.ZipFile(path) as source:
        parts = {info.filename: source.read(info) for info in source.infolist()}
    parts["word/document.xml"] = b"<w:document this is not xml"
    with zipfile.ZipFile(path, "w") as target:
        for name, data in parts.items():
            target.writestr(name, data)
    return path


def _csv_with_junk(path: Path) -> Path:
    """A readable head, then binary junk (NUL bytes, invalid UTF-8) in the middle, then more rows. The junk has
    no double quote, which would open a quoted field that runs on to the end of the file."""
    junk = random.Random(3).randbytes(300).replace(b'"', b"")
    path.write_bytes(CSV_TEXT.encode() + b"junk;" + junk + b";x\n" + b"omega;1;mm\n")
    return path


# -- tests ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def office_env(pipeline_env, monkeypatch):
    """The pipeline of test_input_types (pages of TEXT_PAGE_CHARS characters), with small sheet bounds."""
    monkeypatch.setenv("DOCQUEUE_SHEET_PAGE_ROWS", str(SHEET_PAGE_ROWS))
    monkeypatch.setenv("DOCQUEUE_MAX_SHEET_ROWS", str(MAX_ROWS))
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings

    # built again with the sheet bounds above: the definitions carry the page limits
    _, instance, queue, storage, tmp = pipeline_env
    return build_definitions(Settings.from_env()), instance, queue, storage, tmp


def test_office_documents_go_through_the_pipeline_and_hostile_ones_fail_with_a_sentence(office_env):
    from orchestration.intake import IntakeRules, ingest_paths
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings

    defs, instance, queue, storage, tmp = office_env
    folder = tmp / "in"
    folder.mkdir()
    files = {
        "report.docx": _report(folder / "report.docx"),
        "budget.xlsx": _workbook(folder / "budget.xlsx"),
        "readings.csv": _csv_with_junk(folder / "readings.csv"),
        "broken.docx": _docx_with_broken_body(folder / "broken.docx"),
        "huge.xlsx": _big_sheet(folder / "huge.xlsx", MAX_ROWS + 50),
    }
    rules = IntakeRules.from_settings(Settings.from_env())
    results = {Path(r.path).name: r for r in ingest_paths(queue, storage, [folder], rules=rules)}
    assert {n: r.status for n, r in results.items()} == dict.fromkeys(files, "new"), {
        n: r.reason for n, r in results.items()
    }
    documents = {name: queue.document(r.document_id) for name, r in results.items()}
    assert {n: d["mime_type"] for n, d in documents.items()} == {
        "report.docx": DOCX_MIME,
        "budget.xlsx": XLSX_MIME,
        "readings.csv": "text/csv",
        "broken.docx": DOCX_MIME,
        "huge.xlsx": XLSX_MIME,
    }
    register_partitions(instance, queue.engine, Level.DOCUMENT)

    run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, max_seconds=300)

    documents = {name: queue.document(str(d["id"])) for name, d in documents.items()}
    failed = {name: d["ocr_error"] for name, d in documents.items() if d["ocr_status"] == "failed"}
    assert set(failed) == {"broken.docx", "huge.xlsx"}
    assert failed["huge.xlsx"] == f"too large: more than {MAX_ROWS} rows (DOCQUEUE_MAX_SHEET_ROWS)"
    assert failed["broken.docx"].startswith("corrupt: the Word document cannot be read (")
    assert "\n" not in failed["broken.docx"] and "Traceback" not in failed["broken.docx"]
    with queue.engine.connect() as conn:  # nothing is left waiting or running
        assert (
            conn.exec_driver_sql("""SELECT (SELECT count(*) FROM task_queue_page
                                                WHERE ocr_status IN ('pending', 'processing'))
                                             + (SELECT count(*) FROM task_queue_chunk
                                                WHERE vector_status IN ('pending', 'processing')
                                                   OR graphrag_status IN ('pending', 'processing'))""").scalar()
            == 0
        )

    pages = {}
    for name in ("report.docx", "budget.xlsx", "readings.csv"):
        document = documents[name]
        assert (document["ocr_status"], document["vector_index_status"], document["graphrag_index_status"]) == (
            "completed",
            "completed",
            "completed",
        ), (name, document["ocr_error"])
        rows = queue.pages(document["id"])
        pages[name] = [storage.get_text(p["page_file_path"]) for p in rows]
        assert {p["ocr_method"] for p in rows} == {name.rsplit(".", 1)[1]}
        chunks = queue.chunks(document_id=str(document["id"]))
        assert chunks and all(c["vector_status"] == "completed" for c in chunks)

    # DOCX: the body in order as markdown, split at paragraph boundaries like text
    assert len(pages["report.docx"]) > 1 and all(len(p) <= PAGE_CHARS for p in pages["report.docx"])
    assert "\n\n".join(pages["report.docx"]) == DOCX_MARKDOWN

    # XLSX: pages of at most SHEET_PAGE_ROWS rows, headed by sheet and rows, the header row repeated
    header = "| Region | Units | Price |\n|---|---|---|\n"
    assert pages["budget.xlsx"] == [
        "## Sales (rows 2-4)\n\n" + header + "| North | 120 | 3.5 |\n| South | 80 | 4.25 |\n| East | 95 | 2 |",
        "## Sales (rows 5-8)\n\n" + header + "| West | 60 | 5.5 |\n| Centre | 30 | 1 |\n"
        "| Total | 385 | =AVERAGE(C2:C6) |",
        "## Staff (rows 2-2)\n\n| Name | Role |\n|---|---|\n| Ada | Pilot |",
    ]

    # CSV: the same table pages; ragged rows padded to the widest, junk kept as (replaced) text, nothing lost
    csv_pages = pages["readings.csv"]
    assert csv_pages[0] == (
        "| station | reading | unit |  |\n|---|---|---|---|\n| alpha | 12 | mm |  |\n"
        "| beta | 7 |  |  |\n| gamma | 9 | mm | late |"
    )
    assert all(p.startswith("| station | reading | unit |") for p in csv_pages)
    assert all(len(p) <= PAGE_CHARS for p in csv_pages)
    body = "\n".join(p.split("\n", 2)[2] for p in csv_pages)
    assert all(f"| s{n} | {n} | mm |" in body for n in range(CSV_ROWS)) and "| omega | 1 | mm |" in body
    assert not re.search(r"[\x00-\x1f\x7f]", body.replace("\n", ""))  # control characters become spaces


def test_hostile_office_files_are_refused_at_intake_and_nothing_is_stored(queue, tmp_path, monkeypatch):
    from orchestration.intake import IntakeRules, ingest_paths
    from queue_db.config import Settings
    from resources.storage import LocalStorage

    monkeypatch.setenv("DOCQUEUE_MAX_UNZIPPED_MB", "1")
    folder = tmp_path / "in"
    folder.mkdir()
    with zipfile.ZipFile(folder / "letter.docx", "w") as archive:  # the name says Word, the content does not
        archive.writestr("letter.txt", "a ZIP is not a Word document")
    bomb = _big_sheet(folder / "bomb.xlsx", 60_000)  # a few hundred KB that unpack to several MB
    assert bomb.stat().st_size < 1 << 20
    (folder / "junk.csv").write_bytes(random.Random(5).randbytes(3000))
    results = {
        Path(r.path).name: r
        for r in ingest_paths(
            queue, LocalStorage(tmp_path / "store"), [folder], rules=IntakeRules.from_settings(Settings.from_env())
        )
    }

    assert {n: r.status for n, r in results.items()} == dict.fromkeys(
        ["letter.docx", "bomb.xlsx", "junk.csv"], "rejected"
    )
    assert (
        results["letter.docx"].reason
        == "unsupported: a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX) (detected: application/zip)"
    )
    assert results["bomb.xlsx"].reason.startswith("too large: unpacks to ")
    assert results["bomb.xlsx"].reason.endswith(" MB > limit 1 MB (DOCQUEUE_MAX_UNZIPPED_MB)")
    assert results["junk.csv"].reason == "unsupported: unrecognised binary data (detected: application/octet-stream)"
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM documents").scalar() == 0
    assert not list((tmp_path / "store").rglob("*.*"))


def test_reading_stops_at_the_time_limit_the_sheet_limit_and_rows_wider_than_a_page(tmp_path):
    from processing.office_pages import CSV_MIME, OfficeLimits, office_pages
    from processing.text_pages import TextLimits
    from resources.ocr import DocumentError

    book = _workbook(tmp_path / "book.xlsx")
    report = _report(tmp_path / "report.docx")
    table = tmp_path / "table.csv"
    table.write_text(CSV_TEXT, encoding="utf-8")
    for path, mime in ((book, XLSX_MIME), (report, DOCX_MIME), (table, CSV_MIME)):
        with pytest.raises(DocumentError) as stopped:
            office_pages(path, mime, TextLimits(), OfficeLimits(timeout_s=1e-9))
        assert (stopped.value.error_class, str(stopped.value)) == (
            "timeout",
            "timeout: reading the document took longer than 1e-09 s (DOCQUEUE_OFFICE_TIMEOUT)",
        )
    with pytest.raises(DocumentError, match=r"^too large: 3 sheets > limit 2 \(DOCQUEUE_MAX_SHEETS\)$"):
        office_pages(book, XLSX_MIME, TextLimits(), OfficeLimits(max_sheets=2))
    wide = tmp_path / "wide.csv"
    wide.write_text("a,b,c\n1,2,3\n" + ",".join(["x"] * 30) + "\n", encoding="utf-8")
    with pytest.raises(DocumentError) as refused:
        office_pages(wide, CSV_MIME, TextLimits(page_chars=400), OfficeLimits())
    assert str(refused.value) == (
        "too large: row 3 has 30 columns, more than a page of 400 characters holds (25; DOCQUEUE_TEXT_PAGE_CHARS)"
    )


def test_a_word_table_longer_than_a_page_repeats_its_header_on_every_page(tmp_path):
    from processing.office_pages import OfficeLimits, office_pages
    from processing.text_pages import TextLimits

    document = docx.Document()
    document.add_paragraph("Tide readings for the week.")
    table = document.add_table(rows=41, cols=3)
    for n, row in enumerate(table.rows):
        for cell, value in zip(row.cells, ("Hour", "Height", "Station") if n == 0 else (n, n * 0.1, "Dover")):
            cell.text = str(value)
    document.save(tmp_path / "tides.docx")

    pages = office_pages(tmp_path / "tides.docx", DOCX_MIME, TextLimits(page_chars=PAGE_CHARS), OfficeLimits())
    assert len(pages) > 2 and all(len(p) <= PAGE_CHARS for p in pages)
    assert pages[0].startswith("Tide readings for the week.\n\n| Hour | Height | Station |\n|---|---|---|\n| 1 |")
    assert all(p.startswith("| Hour | Height | Station |\n|---|---|---|\n") for p in pages[1:])
    rows = [line for p in pages for line in p.split("\n") if line.startswith("| ") and "Hour" not in line]
    assert rows == [f"| {n} | {n * 0.1} | Dover |" for n in range(1, 41)]
