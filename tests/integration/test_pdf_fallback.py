"""pdfium's second opinion in the real PDF worker: a page tree PyMuPDF cannot read is read by pdfium and its pages
converted as any other; encryption, the page limit and the setting that turns it off still hold; a file no engine
opens fails with one sentence. Every file is generated here and checked against both libraries first."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pymupdf
import pypdfium2
import pytest

from resources.ocr import DocumentError, PdfLimits, PdfProcessor
from tests import pdf_factory as factory
from tests.conftest import CORPUS_DIR
from tests.figures import announce

RECOVERED = ["# Lighthouse Log", "The keeper trimmed the wick and wrote the weather in a leather journal."]


@pytest.fixture(scope="module")
def processor():
    with PdfProcessor(PdfLimits()) as shared:
        yield shared


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fallback")


@pytest.fixture(scope="module")
def two_pages(folder: Path) -> Path:
    return factory.text_pdf(folder, "two.pdf", [RECOVERED, factory.DEMO_PAGE])


def _engines_disagree(path: Path, password: str | None = None) -> int:
    """The file is what the test needs: PyMuPDF finds no pages or cannot open it, pdfium reads pages with text."""
    try:
        with pymupdf.open(path) as doc:
            if doc.needs_pass:
                doc.authenticate(password)
            assert doc.page_count == 0
    except pymupdf.FileDataError:
        pass
    pdf = pypdfium2.PdfDocument(path, password=password)
    try:
        assert len(pdf) >= 1 and pdf[0].get_textpage().get_text_bounded().strip()
        return len(pdf)
    finally:
        pdf.close()


@pytest.mark.parametrize("flaw,pages", [("count", 2), ("root", 1)])
def test_pdfium_reads_the_pages_of_a_tree_pymupdf_cannot(processor, folder, two_pages, flaw, pages):
    path = factory.broken_page_tree_pdf(folder, f"broken-{flaw}.pdf", [two_pages], flaw=flaw)
    assert _engines_disagree(path) == pages

    info = processor.inspect(path)

    assert (info.engine, info.page_count, info.repaired, info.encrypted) == ("pdfium", pages, True, False)
    for number in range(1, pages + 1):  # the same markdown, by the same path, as the intact file's pages
        recovered = processor.convert_page(path, number, boilerplate=info.boilerplate)
        intact = processor.convert_page(two_pages, number, boilerplate=info.boilerplate)
        assert (recovered.method, recovered.markdown) == ("text-layer", intact.markdown)
    assert "Lighthouse Log" in recovered.markdown if pages == 1 else "Rotterdam" in recovered.markdown


def test_a_readable_pdf_is_read_by_pymupdf(processor, two_pages):
    assert processor.inspect(two_pages).engine == "pymupdf"


def test_with_the_fallback_off_pymupdfs_verdict_stands(folder, two_pages):
    path = factory.broken_page_tree_pdf(folder, "broken-off.pdf", [two_pages])
    with PdfProcessor(PdfLimits(pdf_fallback="off")) as strict:
        with pytest.raises(DocumentError) as caught:
            strict.inspect(path)
    assert (caught.value.error_class, caught.value.reason) == ("empty", "empty: document has no pages")


def test_the_page_limit_holds_for_pdfiums_pages_before_any_is_copied(processor, folder):
    path = factory.break_page_tree(factory.blank_pages_pdf(folder, 2001))
    started = time.monotonic()
    with pytest.raises(DocumentError) as caught:
        processor.inspect(path)
    assert (caught.value.error_class, caught.value.reason) == ("too_large", "too many pages: 2001 > limit 2000")
    assert time.monotonic() - started < 5


def test_an_encrypted_pdf_stays_encrypted_without_its_password(processor, folder):
    path = factory.encrypted_pdf(folder, "locked.pdf", "harbour")
    data = path.read_bytes()
    assert data.count(b"/Count 1") == 1  # the page tree is not encrypted: its /Count is patched in place
    path.write_bytes(data.replace(b"/Count 1", b"/Count 0"))
    assert _engines_disagree(path, "harbour") == 1

    for password, reason in ((None, "encrypted: password required"), ("wrong", "encrypted: wrong password")):
        with pytest.raises(DocumentError) as caught:
            processor.inspect(path, password=password)
        assert (caught.value.error_class, caught.value.reason) == ("encrypted", reason)
    info = processor.inspect(path, password="harbour")
    assert (info.engine, info.encrypted, info.page_count) == ("pdfium", True, 1)
    assert "salary review" in processor.convert_page(path, 1, password="harbour").markdown


def test_a_pdf_no_engine_opens_fails_with_one_sentence(processor, folder):
    path = factory.unreadable_pdf(folder)
    with pytest.raises(DocumentError) as caught:
        processor.inspect(path)
    error = caught.value
    assert (error.error_class, error.retryable) == ("corrupt", False)
    assert error.reason == (
        "corrupt: cannot open as PDF (Failed to open file 'unreadable.pdf' as type pdf.); "
        "pdfium cannot open it either (data format error)"
    )
    assert processor.inspect(factory.text_pdf(folder, "after.pdf", [RECOVERED])).page_count == 1  # worker intact


@pytest.mark.corpus
def test_corpus_files_pymupdf_finds_no_pages_in_get_pdfiums_opinion(processor, request):
    """The corpus files PyMuPDF cannot open or finds no pages in: each is rescued by pdfium, or fails with a
    sentence that says pdfium could not read it either."""
    with open(CORPUS_DIR / "MANIFEST.tsv", newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle, delimiter="\t") if r["pages_pymupdf"].startswith(("0", "ERR"))]
    assert rows
    outcomes = {}
    for row in rows:
        started = time.monotonic()
        try:
            info = processor.inspect(CORPUS_DIR / row["filename"])
            outcomes[row["filename"]] = f"rescued: {info.page_count} page(s) read by {info.engine}"
            assert info.engine == "pdfium" and info.page_count >= 1
        except DocumentError as error:
            outcomes[row["filename"]] = error.reason
            assert error.error_class in ("corrupt", "empty", "encrypted"), error.reason
            assert error.error_class == "encrypted" or "pdfium" in error.reason, error.reason
            assert "\n" not in error.reason
        assert time.monotonic() - started < 10
    rescued = sum(o.startswith("rescued") for o in outcomes.values())
    lines = [f"\n[pdf fallback] corpus files PyMuPDF reads no pages in: {len(rows)}, rescued by pdfium: {rescued}"]
    announce(request, "\n".join(lines + [f"  {name}: {outcome}" for name, outcome in outcomes.items()]))
