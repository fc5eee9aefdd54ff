"""DOCQUEUE_OCR_LANGUAGES: Tesseract reads OCR'd pages for the languages it names, in the real PDF worker process.

Needs Debian's `tesseract` with English and Russian data (test.sh installs tesseract-ocr and tesseract-ocr-rus);
the tests that read with it are skipped, with the reason, where they are missing. The sentence for a Tesseract that
is asked for but missing is tested everywhere.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pymupdf
import pytest

from queue_db.config import Settings
from resources.ocr import DocumentError, PdfLimits, PdfProcessor
from resources.ocr_resource import OcrResource
from tests import pdf_factory as factory
from tests.figures import announce


def _languages() -> set[str]:
    if shutil.which("tesseract") is None:
        return set()
    listed = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True, timeout=30).stdout
    return {line.strip() for line in listed.splitlines()[1:]}


needs_tesseract = pytest.mark.skipif(
    not {"eng", "rus"} <= _languages(),
    reason="needs Debian's tesseract-ocr and tesseract-ocr-rus (test.sh installs them as root)",
)


@pytest.fixture(scope="module")
def cyrillic_scan(tmp_path_factory) -> tuple[Path, str]:
    return factory.scanned_pdf(tmp_path_factory.mktemp("cyrillic"), "cyrillic.pdf", factory.CYRILLIC_TEXT)


@needs_tesseract
def test_a_cyrillic_scan_is_read_with_the_setting_and_not_without(request, cyrillic_scan):
    path, truth = cyrillic_scan
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus")) as tesseract:
        read = tesseract.convert_page(path, 1)
    with PdfProcessor(PdfLimits()) as rapidocr:
        unread = rapidocr.convert_page(path, 1)
    recall, without = factory.word_recall(truth, read.markdown), factory.word_recall(truth, unread.markdown)
    announce(request, f"[ocr] Cyrillic scan, word recall: eng+rus Tesseract {recall:.3f}, RapidOCR {without:.3f}")
    assert read.method == "ocr:tesseract" and unread.method == "ocr:rapidocr"
    assert recall >= 0.9, read.markdown
    assert without < 0.2, unread.markdown


@needs_tesseract
def test_the_setting_reaches_the_worker_from_the_environment(monkeypatch, cyrillic_scan):
    monkeypatch.setenv("DOCQUEUE_OCR_LANGUAGES", "rus")
    limits = OcrResource.from_settings(Settings.from_env()).limits()
    assert limits.ocr_languages == "rus"
    with PdfProcessor(limits) as processor:
        page = processor.convert_page(cyrillic_scan[0], 1)
    assert page.method == "ocr:tesseract" and "маяка" in page.markdown, page.markdown


@needs_tesseract
def test_a_text_layer_is_still_read_as_text(tmp_path: Path):
    path = factory.text_pdf(tmp_path, "text.pdf", [factory.DEMO_PAGE])
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus")) as processor:
        assert processor.convert_page(path, 1).method == "text-layer"


@pytest.fixture(scope="module")
def lookalike_scan(tmp_path_factory) -> tuple[Path, str]:
    return factory.lookalike_layer_pdf(tmp_path_factory.mktemp("lookalike"), "lookalike.pdf")


@needs_tesseract
def test_an_earlier_ocr_layer_of_latin_lookalikes_is_read_again_and_says_why(request, lookalike_scan):
    path, truth = lookalike_scan
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus")) as tesseract:
        read = tesseract.convert_page(path, 1)
    recall = factory.word_recall(truth, read.markdown)
    announce(request, f"[ocr] look-alike layer over a Cyrillic scan, eng+rus Tesseract word recall {recall:.3f}")
    assert read.method == "ocr:tesseract:lookalike-layer", read.markdown[:200]
    assert recall >= 0.9, read.markdown
    # the rule relaxed, or no Cyrillic-script language to read the print with: the layer stays, the test can tell
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus", max_lookalike_share=1.0)) as relaxed:
        kept = relaxed.convert_page(path, 1)
    assert kept.method == "text-layer" and "CMoTpuTenb" in kept.markdown, kept.markdown[:200]
    with PdfProcessor(PdfLimits(ocr_languages="eng")) as english:
        assert english.convert_page(path, 1).method == "text-layer"


@needs_tesseract
def test_a_planted_version_copies_what_docqueue_reads(tmp_path: Path, lookalike_scan):
    from bench import _planted

    reading = _planted.DocqueueReading(PdfLimits(ocr_languages="eng+rus"))
    try:
        version = _planted.write_version(lookalike_scan[0], tmp_path, random.Random(7), reading)
    finally:
        reading.close()
    with pymupdf.open(version) as doc:
        text = doc[0].get_text()
    assert reading.distrusted_pages == 1
    assert "маяка" in text and "CMoTpuTenb" not in text, text[:200]


def test_tesseract_asked_for_but_missing_is_one_sentence(monkeypatch, tmp_path: Path, cyrillic_scan):
    monkeypatch.setenv("PATH", str(tmp_path))  # the worker inherits it: no tesseract on it
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus")) as processor:
        with pytest.raises(DocumentError) as caught:
            processor.convert_page(cyrillic_scan[0], 1)
    assert str(caught.value) == (
        "internal: DOCQUEUE_OCR_LANGUAGES=eng+rus asks for Tesseract, but the tesseract program is not installed "
        "(Debian: apt-get install tesseract-ocr tesseract-ocr-eng tesseract-ocr-rus)"
    )
    assert caught.value.retryable  # installing it and retrying the page is the cure


@needs_tesseract
def test_a_language_without_data_is_one_sentence(cyrillic_scan):
    with PdfProcessor(PdfLimits(ocr_languages="eng+xyz")) as processor:
        with pytest.raises(DocumentError) as caught:
            processor.convert_page(cyrillic_scan[0], 1)
    assert str(caught.value) == (
        "internal: Tesseract has no data for xyz (DOCQUEUE_OCR_LANGUAGES=eng+xyz; Debian: apt-get install "
        "tesseract-ocr-xyz)"
    )


@needs_tesseract
def test_a_slow_page_ends_as_a_timeout_and_leaves_no_tesseract_behind(tmp_path: Path):
    # a page full of words rendered at 600 dpi: about 10 s of Tesseract on a quiet machine, against 3 s allowed
    path, _ = factory.scanned_pdf(tmp_path, "dense.pdf", " ".join([factory.SCANNED_TEXT] * 6))
    with PdfProcessor(PdfLimits(ocr_languages="eng+rus", ocr_dpi=600, page_timeout_s=3)) as processor:
        with pytest.raises(DocumentError) as caught:
            processor.convert_page(path, 1)
        worker = processor.worker_pid
    assert caught.value.error_class == "timeout", caught.value
    if worker is not None:  # the worker answered the timeout itself: its Tesseract is gone with the answer
        assert str(caught.value) == "timeout: page 1 took more than 3 s (Tesseract stopped)"
        assert not _children(worker)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
