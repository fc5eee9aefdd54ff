"""PdfProcessor on the real-world corpus (../shared/corpus); skipped when it is absent.

Prints a file -> outcome table and the measured throughput at the end of the module.
"""

from __future__ import annotations

import csv
import os
import re
import time
from pathlib import Path

import pymupdf
import pytest

from processing.page_cleanup import comparable_words, unmapped_share
from resources.ocr import DocumentError, PdfLimits, PdfProcessor
from tests import pdf_factory as factory
from tests.figures import announce

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("DOCQUEUE_CORPUS", REPO.parent / "shared" / "corpus"))
MANIFEST = CORPUS / "MANIFEST.tsv"

pytestmark = [pytest.mark.corpus, pytest.mark.skipif(not MANIFEST.is_file(), reason=f"corpus not found at {CORPUS}")]

TEXT_PAGES_PER_FILE = 3


def _entries(category: str) -> list[dict]:
    if not MANIFEST.is_file():
        return []
    with MANIFEST.open(newline="", encoding="utf-8") as handle:
        return [row for row in csv.DictReader(handle, delimiter="\t") if row["category"] == category]


def _ids(entries: list[dict]) -> list[str]:
    return [entry["filename"] for entry in entries]


def _password(notes: str) -> str | None:
    match = re.search(r"\bpassword (?!unknown)(\S+)", notes)
    return match.group(1) if match else None


def _cpu_seconds(pid: int | None) -> float:
    """User+system CPU time of a live process (the worker), from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Pages, wall seconds and worker CPU seconds per conversion method."""

    def __init__(self):
        self.totals: dict[str, list[float]] = {}

    def convert(self, processor: PdfProcessor, path: Path, page_number: int, **kwargs):
        pid = processor.worker_pid
        cpu_before, started = _cpu_seconds(pid), time.monotonic()
        result = processor.convert_page(path, page_number, **kwargs)
        wall = time.monotonic() - started
        cpu = _cpu_seconds(pid) - cpu_before if pid and pid == processor.worker_pid else float("nan")
        pages, walls, cpus = self.totals.setdefault(result.method, [0, 0.0, 0.0])
        self.totals[result.method] = [pages + 1, walls + wall, cpus + (0.0 if cpu != cpu else cpu)]
        return result

    def lines(self) -> list[str]:
        out = []
        for method, (pages, wall, cpu) in sorted(self.totals.items()):
            out.append(
                f"  {method:<13} {int(pages):>3} pages  {pages / wall:6.2f} pages/s wall  "
                f"{cpu / pages:6.2f} worker CPU-s/page"
            )
        return out


@pytest.fixture(scope="module")
def processor():
    with PdfProcessor(PdfLimits()) as shared:
        yield shared


@pytest.fixture(scope="module")
def meter() -> Meter:
    return Meter()


@pytest.fixture(scope="module")
def outcomes(request, meter):
    table: dict[str, str] = {}
    yield table
    lines = ["", "corpus file -> outcome"]
    lines += [f"  {name:<48} {outcome}" for name, outcome in sorted(table.items())]
    lines += ["throughput (2 cores, machine shared with other jobs):"] + meter.lines()
    for line in lines:
        _report(request, line)


def _report(request, text: str) -> None:
    announce(request, text)


def _unmapped_layer(path: Path, page_number: int) -> bool:
    with pymupdf.open(path) as doc:
        return unmapped_share(doc[page_number - 1].get_text()) > PdfLimits().max_unmapped_share


def _layer_text(path: Path, page_number: int) -> str:
    """The page's own text layer, in the form the markdown uses (ligatures, hyphenation)."""
    with pymupdf.open(path) as doc:
        return " ".join(comparable_words(doc[page_number - 1].get_text()))


@pytest.mark.parametrize("entry", _entries("text"), ids=_ids(_entries("text")))
def test_text_files_yield_their_real_words(processor, meter, outcomes, entry):
    path = CORPUS / entry["filename"]
    info = processor.inspect(path)
    assert info.page_count == int(entry["pages_pymupdf"])
    last = min(info.page_count, TEXT_PAGES_PER_FILE)
    recalls, ocred = [], 0
    for number in range(1, last + 1):
        page = meter.convert(processor, path, number, boilerplate=info.boilerplate)
        if _unmapped_layer(path, number):
            # a layer of glyph ids its fonts cannot map (TAMReview's): OCR reads the page, and the layer is no
            # truth to measure it against
            assert page.method == "ocr:rapidocr:unmapped-layer" and len(factory.words(page.markdown)) >= 50, (
                page.markdown[:200]
            )
            ocred += 1
            continue
        assert page.method == "text-layer"
        recalls.append(factory.word_recall(_layer_text(path, number), " ".join(comparable_words(page.markdown))))
    outcomes[entry["filename"]] = (
        f"ok: {last - ocred}/{info.page_count} pages text-layer, layer-word recall "
        f">= {min(recalls, default=1.0):.2f}, {ocred} OCR'd (unmapped layer), {len(info.boilerplate)} boilerplate lines"
    )
    assert min(recalls, default=1.0) >= 0.9, recalls


def test_tracemonkey_markdown_has_structure_and_is_deterministic(processor):
    path = CORPUS / "pdfjs__tracemonkey.pdf"
    first = processor.convert_page(path, 1).markdown
    assert first.startswith("# ") and "Trace-based Just-in-Time Type Specialization" in first
    assert "JavaScript" in first and "**Abstract**" in first
    later = processor.convert_page(path, 9).markdown
    with PdfProcessor() as fresh:
        assert fresh.convert_page(path, 9).markdown == later


@pytest.mark.parametrize("entry", _entries("scanned"), ids=_ids(_entries("scanned")))
def test_scanned_files_are_ocred(processor, meter, outcomes, entry, request):
    path = CORPUS / entry["filename"]
    info = processor.inspect(path)
    page = meter.convert(processor, path, 1, boilerplate=info.boilerplate)
    assert page.method == "ocr:rapidocr"
    found = factory.words(page.markdown)
    detail = f"ocr: {len(found)} words on page 1 in {page.seconds:.1f} s"
    truth_file = CORPUS / "ground-truth" / "ocrmypdf__linn.txt"
    if entry["filename"] in ("ocrmypdf__linn.pdf", "ocrmypdf__skew.pdf") and truth_file.is_file():
        recall = factory.word_recall(truth_file.read_text(encoding="utf-8"), page.markdown)
        detail += f", word recall vs linn.txt {recall:.3f}"
        _report(request, f"[ocr] {entry['filename']}: word recall vs ground truth {recall:.3f}")
        assert recall >= (0.93 if entry["filename"] == "ocrmypdf__linn.pdf" else 0.85)
    outcomes[entry["filename"]] = detail
    if "picture, not text" in entry["notes"]:
        return  # a photograph: finishing cleanly is the requirement
    assert len(found) >= 20, page.markdown
    if entry["filename"] == "ocrmypdf__francais.pdf":
        assert {"whisky", "intérieure", "œuvre"} <= set(found), page.markdown


@pytest.mark.parametrize("entry", _entries("encrypted"), ids=_ids(_entries("encrypted")))
def test_encrypted_files(processor, outcomes, entry):
    path = CORPUS / entry["filename"]
    with pytest.raises(DocumentError) as caught:
        processor.inspect(path)
    assert (caught.value.error_class, caught.value.reason) == ("encrypted", "encrypted: password required")
    password = _password(entry["notes"])
    if password is None:
        outcomes[entry["filename"]] = "encrypted: password required (password unknown)"
        return
    with pytest.raises(DocumentError, match="encrypted: wrong password"):
        processor.inspect(path, password=password + "x")
    info = processor.inspect(path, password=password)
    assert info.encrypted and info.page_count >= 1
    page = processor.convert_page(path, 1, password=password, boilerplate=info.boilerplate)
    assert page.chars > 0
    outcomes[entry["filename"]] = f"opens with the manifest password: {page.method}, {page.chars} chars"


@pytest.mark.parametrize("entry", _entries("corrupt"), ids=_ids(_entries("corrupt")))
def test_corrupt_files_fail_specifically_or_repair(processor, outcomes, entry):
    path = CORPUS / entry["filename"]
    started = time.monotonic()
    try:
        info = processor.inspect(path)
        page = processor.convert_page(path, 1, boilerplate=info.boilerplate)
    except DocumentError as error:
        outcomes[entry["filename"]] = f"{error.error_class}: {error.reason}"
        assert error.error_class in {"corrupt", "empty", "unsupported"}, error.reason
        assert error.retryable is False
        assert re.match(r"^(corrupt|empty|unsupported): \S", error.reason)
        if entry["filename"] == "pdfjs__Pages-tree-refs.pdf":
            assert error.reason == "corrupt: cycle in page tree"
    else:
        outcomes[entry["filename"]] = (
            f"repaired: {info.page_count} page(s), {page.method}, {page.markdown.strip()!r:.40}"
        )
        assert info.repaired
        if entry["filename"] == "pdfjs__helloworld-bad.pdf":
            assert "Hello" in page.markdown
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("entry", _entries("other"), ids=_ids(_entries("other")))
def test_other_files_finish_cleanly(processor, outcomes, entry):
    path = CORPUS / entry["filename"]
    started = time.monotonic()
    info = processor.inspect(path)
    page = processor.convert_page(path, 1, boilerplate=info.boilerplate)
    elapsed = time.monotonic() - started
    outcomes[entry["filename"]] = f"ok: {page.method}, {page.chars} chars in {elapsed:.1f} s"
    assert elapsed < 30
    expected = {
        "pdfjs__bomb_giant.pdf": "GIANT JBIG2 BOMB",
        "pypdf__libreoffice-form.pdf": "Example for a Form",
        "pdfjs__empty.pdf": "",
    }.get(entry["filename"])
    if expected is not None:
        assert expected in page.markdown
    if entry["filename"] == "pdfjs__empty.pdf":
        assert page.markdown == ""
