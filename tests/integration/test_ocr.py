"""PdfProcessor on generated PDFs: real PyMuPDF, real RapidOCR, a real worker process."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from queue_db.config import Settings
from resources.ocr import DocumentError, PdfLimits, PdfProcessor
from resources.ocr_resource import OcrResource
from tests import pdf_factory as factory
from tests.figures import announce

REPO = Path(__file__).resolve().parents[2]
HEADER = "Northwind Logistics - Internal Report"


def _report(request, text: str) -> None:
    announce(request, text)


@pytest.fixture(scope="module")
def processor():
    with PdfProcessor(PdfLimits()) as shared:
        yield shared


@pytest.fixture(scope="module")
def pdf_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pdfs")


@pytest.fixture(scope="module")
def report_pdf(pdf_dir: Path) -> Path:
    pages = [
        factory.DEMO_PAGE,
        ["## Shipping lanes", "The Baltic lane carried timber and grain to the northern ports all autumn."],
        ["## Staffing", "Seasonal hires joined the night shift to clear the backlog before December."],
        ["## Outlook", "Fuel prices remain the largest uncertainty for the coming quarter."],
    ]
    return factory.text_pdf(pdf_dir, "report.pdf", pages, header=HEADER)


@pytest.fixture(scope="module")
def scanned(pdf_dir: Path) -> tuple[Path, str]:
    return factory.scanned_pdf(pdf_dir, "scanned.pdf")


def _assert_fails(call, error_class: str, reason_start: str) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        call()
    error = caught.value
    assert error.error_class == error_class, error.reason
    assert error.reason.startswith(reason_start), error.reason
    assert "Traceback" not in error.reason and len(error.reason) < 300
    return error


# -- text layer ------------------------------------------------------------------
def test_text_layer_keeps_headings_lists_and_tables(processor: PdfProcessor, report_pdf: Path):
    info = processor.inspect(report_pdf)
    assert (info.page_count, info.encrypted, info.repaired) == (4, False, False)

    page = processor.convert_page(report_pdf, 1, boilerplate=info.boilerplate)
    assert page.method == "text-layer" and page.page_number == 1 and page.chars == len(page.markdown)
    lines = page.markdown.splitlines()
    assert any(line.startswith("# ") and "Quarterly Operations Report" in line for line in lines)
    assert any(line.startswith("## ") and "Highlights" in line for line in lines)
    bullets = [line.strip() for line in lines if line.strip().startswith("- ")]
    assert len(bullets) == 3 and "Shipments grew by eighteen percent" in bullets[0]
    assert "|Region|Shipments|Returns|" in page.markdown
    assert "|North|1200|31|" in page.markdown
    assert "office finished migrating" in page.markdown  # ligatures spelled out


def test_tables_and_graphics_are_looked_for_only_on_pages_that_draw_paths(report_pdf: Path):
    """The table search reads every character of a page before it looks for drawn lines, and the background
    colour takes four renderings: a page without vector paths is converted without either, to the same markdown,
    and a ruled table is still found."""
    script = (
        "import json, sys\n"
        "from resources.pymupdf_loader import pymupdf\n"
        "import pymupdf4llm\n"
        "from resources import _pdf_pages as pages\n"
        "pymupdf4llm.use_layout(False)\n"  # as the PDF worker converts
        "searches = []\n"
        "search = pymupdf.Page.find_tables\n"
        "pymupdf.Page.find_tables = lambda page, *a, **k: searches.append(1) or search(page, *a, **k)\n"
        "renders = []\n"
        "render = pymupdf.Page.get_pixmap\n"
        "pymupdf.Page.get_pixmap = lambda page, *a, **k: renders.append(1) or render(page, *a, **k)\n"
        "doc = pymupdf.open(sys.argv[1])\n"
        "headers = pages.HeaderSizes(doc, list(range(doc.page_count)))\n"
        "out = {}\n"
        "for index in (0, 1):\n"
        "    before, rendered = len(searches), len(renders)\n"
        "    out[index] = {'draws': pages.draws_paths(doc[index]),\n"
        "                  'markdown': pages.text_layer_markdown(doc, index, headers)}\n"
        "    out[index]['searched'] = len(searches) - before\n"
        "    out[index]['rendered'] = len(renders) - rendered\n"
        "pages.draws_paths = lambda page: True\n"  # the search forced on the plain page, as before
        "out['forced'] = pages.text_layer_markdown(doc, 1, headers)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(report_pdf)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ruled, plain = out["0"], out["1"]
    assert ruled["draws"] and ruled["searched"] == 1 and ruled["rendered"] > 0
    assert "|North|1200|31|" in ruled["markdown"]
    assert not plain["draws"] and plain["searched"] == 0 and plain["rendered"] == 0
    assert "Shipping lanes" in plain["markdown"] and out["forced"] == plain["markdown"]


def test_header_footer_and_page_numbers_are_removed(processor: PdfProcessor, report_pdf: Path):
    info = processor.inspect(report_pdf)
    assert "northwind logistics - internal report" in info.boilerplate
    assert "page # of #" in info.boilerplate
    for number in range(1, 5):
        with_furniture = processor.convert_page(report_pdf, number)
        cleaned = processor.convert_page(report_pdf, number, boilerplate=info.boilerplate)
        assert HEADER in with_furniture.markdown  # the header really is in the text layer
        assert HEADER not in cleaned.markdown
        assert f"Page {number} of 4" not in cleaned.markdown and "Page" not in with_furniture.markdown.splitlines()[-1]
    assert "Fuel prices remain" in cleaned.markdown


def test_conversion_is_deterministic_whatever_ran_before(processor: PdfProcessor, report_pdf: Path, pdf_dir: Path):
    info = processor.inspect(report_pdf)
    first = processor.convert_page(report_pdf, 3, boilerplate=info.boilerplate).markdown
    processor.convert_page(report_pdf, 1, boilerplate=info.boilerplate)
    processor.convert_page(factory.text_pdf(pdf_dir, "other.pdf", [["# Other", "Unrelated words."]]), 1)
    again = processor.convert_page(report_pdf, 3, boilerplate=info.boilerplate).markdown
    with PdfProcessor() as fresh:
        cold = fresh.convert_page(report_pdf, 3, boilerplate=info.boilerplate).markdown
    assert first == again == cold


def test_two_topic_documents_keep_their_words(processor: PdfProcessor, pdf_dir: Path):
    bees, volcanoes = factory.two_topic_pdfs(pdf_dir)
    bees_text = processor.convert_page(bees, 1).markdown
    volcano_text = processor.convert_page(volcanoes, 1).markdown
    assert "honey" in bees_text and "extractor" in bees_text and "magma" not in bees_text
    assert "magma" in volcano_text and "eruption" in volcano_text and "honey" not in volcano_text
    for topic, text in zip(factory.TWO_TOPICS, (bees_text, volcano_text)):
        assert factory.word_recall("\n".join(factory.TWO_TOPICS[topic]), text) >= 0.98


# -- OCR ---------------------------------------------------------------------------
def test_scanned_page_is_ocred_while_the_caller_stays_responsive(processor, scanned, request):
    path, truth = scanned
    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.02)

    beat = threading.Thread(target=heartbeat)
    beat.start()
    started = time.monotonic()
    try:
        page = processor.convert_page(path, 1)
    finally:
        stop.set()
        beat.join()
    elapsed = time.monotonic() - started
    recall = factory.word_recall(truth, page.markdown)
    _report(request, f"[ocr] generated scanned page: word recall {recall:.3f}, {page.seconds:.1f} s in the worker")
    assert page.method == "ocr:rapidocr"
    assert recall >= 0.95, page.markdown
    longest_gap = max(b - a for a, b in zip(ticks, ticks[1:]))
    assert len(ticks) >= elapsed / 0.02 * 0.3 and longest_gap < 1.0, (len(ticks), elapsed, longest_gap)


def test_a_text_layer_its_fonts_could_not_map_is_read_by_ocr(processor, pdf_dir: Path):
    path, truth = factory.unmapped_layer_pdf(pdf_dir, "unmapped.pdf")
    page = processor.convert_page(path, 1)
    assert page.method == "ocr:rapidocr:unmapped-layer", page.markdown[:200]
    assert factory.word_recall(truth, page.markdown) >= 0.95, page.markdown
    assert "\x04" not in page.markdown
    # with the rule relaxed to accept any layer, the same page keeps its junk: the test can tell
    with PdfProcessor(PdfLimits(max_unmapped_share=1.0)) as relaxed:
        assert relaxed.convert_page(path, 1).method == "text-layer"


@pytest.mark.corpus
def test_pdfjs_tamreview_pages_are_read_by_ocr(processor):
    from tests.conftest import CORPUS_DIR

    page = processor.convert_page(CORPUS_DIR / "pdfjs__TAMReview.pdf", 2)
    assert page.method == "ocr:rapidocr:unmapped-layer"
    assert {"technology", "acceptance", "model", "abstract"} <= set(factory.words(page.markdown)), page.markdown[:300]


def test_poster_page_is_rendered_within_the_pixel_budget(processor, pdf_dir: Path):
    page = processor.convert_page(factory.poster_pdf(pdf_dir), 1)
    assert page.method == "ocr:rapidocr"
    assert {"giant", "poster"} <= set(factory.words(page.markdown)), page.markdown


def test_blank_pages_convert_to_nothing_without_ocr(processor, pdf_dir: Path):
    path = factory.blank_pages_pdf(pdf_dir, 3)
    assert processor.inspect(path).page_count == 3
    page = processor.convert_page(path, 2)
    assert (page.markdown, page.method) == ("", "text-layer") and page.seconds < 5


def test_huge_image_is_converted(processor, pdf_dir: Path):
    path = factory.huge_image_pdf(pdf_dir)
    started = time.monotonic()
    page = processor.convert_page(path, 1)
    assert page.method == "ocr:rapidocr" and time.monotonic() - started < 60


# -- hostile and broken inputs -------------------------------------------------------
def test_encrypted_pdf_needs_the_right_password(processor, pdf_dir: Path):
    path = factory.encrypted_pdf(pdf_dir, "secret.pdf", "correct horse")
    error = _assert_fails(lambda: processor.inspect(path), "encrypted", "encrypted: password required")
    assert error.retryable is False
    _assert_fails(lambda: processor.inspect(path, password="wrong"), "encrypted", "encrypted: wrong password")
    _assert_fails(lambda: processor.convert_page(path, 1), "encrypted", "encrypted: password required")
    info = processor.inspect(path, password="correct horse")
    assert info.encrypted and info.page_count == 1
    page = processor.convert_page(path, 1, password="correct horse")
    assert "salary review" in page.markdown


def test_password_never_appears_in_errors(processor, pdf_dir: Path):
    path = factory.encrypted_pdf(pdf_dir, "secret2.pdf", "hunter2-pass")
    with pytest.raises(DocumentError) as caught:
        processor.convert_page(path, 1, password="not-hunter2-guess")
    assert "hunter2" not in caught.value.reason and "hunter2" not in repr(caught.value)


def test_zero_byte_and_non_pdf_files(processor, pdf_dir: Path):
    _assert_fails(lambda: processor.inspect(factory.zero_byte_pdf(pdf_dir)), "empty", "empty: file is 0 bytes")
    _assert_fails(lambda: processor.inspect(factory.not_a_pdf(pdf_dir)), "unsupported", "unsupported: not a PDF")


def test_truncated_pdf_is_repaired_or_rejected_cleanly(processor, pdf_dir: Path):
    path = factory.truncated_pdf(pdf_dir)
    try:
        info = processor.inspect(path)
    except DocumentError as error:
        assert error.error_class == "corrupt", error.reason
        return
    assert info.repaired
    assert "First page words" in processor.convert_page(path, 1).markdown
    for number in range(2, info.page_count + 1):
        try:
            processor.convert_page(path, number)
        except DocumentError as error:
            assert error.error_class == "corrupt", error.reason


def test_ten_thousand_pages_are_refused_without_reading_them(processor, pdf_dir: Path):
    path = factory.blank_pages_pdf(pdf_dir, 10_000)
    started = time.monotonic()
    _assert_fails(lambda: processor.inspect(path), "too_large", "too many pages: 10000 > limit 2000")
    assert time.monotonic() - started < 5


def test_deeply_nested_objects_give_a_corrupt_page(processor, pdf_dir: Path):
    path = factory.nested_objects_pdf(pdf_dir)
    started = time.monotonic()
    info = processor.inspect(path)
    assert info.page_count == 1
    _assert_fails(lambda: processor.convert_page(path, 1), "corrupt", "corrupt: page 1 cannot be read")
    assert time.monotonic() - started < 10


def test_page_tree_cycle_is_corrupt(processor, tmp_path: Path):
    objects = [
        b"<</Type/Catalog/Pages 2 0 R>>",
        b"<</Type/Pages/Kids[3 0 R 4 0 R]/Count 2>>",
        b"<</Type/Page/Parent 2 0 R/MediaBox[0 0 612 792]>>",
        b"<</Type/Pages/Kids[5 0 R]/Count 1>>",
        b"<</Type/Pages/Kids[4 0 R]/Count 1>>",
    ]
    path = tmp_path / "cycle.pdf"
    path.write_bytes(factory.raw_pdf(objects))
    _assert_fails(lambda: processor.inspect(path), "corrupt", "corrupt: cycle in page tree")


def test_file_size_limit(pdf_dir: Path, report_pdf: Path):
    size = report_pdf.stat().st_size
    with PdfProcessor(PdfLimits(max_file_bytes=size - 1)) as small:
        error = _assert_fails(lambda: small.inspect(report_pdf), "too_large", "too large: ")
        assert "> limit" in error.reason and error.retryable is False
        assert small.worker_pid is None  # refused before any PDF code ran


def test_missing_page_and_missing_file(processor, report_pdf: Path, tmp_path: Path):
    _assert_fails(lambda: processor.convert_page(report_pdf, 9), "unsupported", "unsupported: page 9 does not exist")
    _assert_fails(lambda: processor.inspect(tmp_path / "gone.pdf"), "internal", "internal: file not found")
    with pytest.raises(ValueError):
        processor.convert_page(report_pdf, 0)


# -- isolation: timeouts, crashes, memory ----------------------------------------------
def test_timeout_kills_and_replaces_the_worker(scanned, report_pdf: Path):
    path, _ = scanned
    with PdfProcessor(PdfLimits(page_timeout_s=0.5)) as impatient:
        impatient.inspect(report_pdf)
        first_pid = impatient.worker_pid
        started = time.monotonic()
        error = _assert_fails(
            lambda: impatient.convert_page(path, 1), "timeout", "timeout: page 1 took more than 0.5 s"
        )
        assert error.retryable is True and time.monotonic() - started < 5
        assert impatient.worker_pid is None and not _pid_alive(first_pid)
        assert "Quarterly" in impatient.convert_page(report_pdf, 1).markdown  # a fresh worker took over
        assert impatient.worker_pid not in (None, first_pid)


def test_worker_crash_becomes_an_internal_error(scanned, report_pdf: Path):
    path, _ = scanned
    with PdfProcessor() as victim:
        victim.inspect(report_pdf)
        pid = victim.worker_pid
        killer = threading.Timer(0.3, os.kill, args=(pid, signal.SIGSEGV))
        killer.start()
        try:
            error = _assert_fails(lambda: victim.convert_page(path, 1), "internal", "internal: PDF worker crashed")
        finally:
            killer.cancel()
        assert "SIGSEGV" in error.reason and error.retryable is True
        assert victim.convert_page(report_pdf, 2).method == "text-layer"


def test_interrupted_call_does_not_leak_its_reply_into_the_next(scanned, report_pdf: Path):
    path, _ = scanned

    class Interrupted(BaseException):
        pass

    def interrupt(*_):
        raise Interrupted()

    with PdfProcessor() as processor:
        processor.inspect(report_pdf)
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(Interrupted):
                processor.convert_page(path, 1)  # OCR takes far longer than 0.3 s
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        page = processor.convert_page(report_pdf, 2)
        assert page.page_number == 2 and "Shipping lanes" in page.markdown


def test_memory_cap_gives_resource_limit_and_recovers(pdf_dir: Path, report_pdf: Path):
    huge = factory.huge_image_pdf(pdf_dir, "huge_for_cap.pdf")  # 400 MB once decoded
    with PdfProcessor(PdfLimits(max_memory_mb=700)) as capped:
        error = _assert_fails(
            lambda: capped.convert_page(huge, 1),
            "resource_limit",
            "resource limit: page 1 exceeded the 700 MB memory cap",
        )
        assert error.retryable is True
        assert "Quarterly" in capped.convert_page(report_pdf, 1).markdown


def test_a_worker_started_ahead_serves_the_first_call_and_a_dead_one_is_replaced(report_pdf: Path):
    with PdfProcessor() as ahead:
        ahead.start()  # returns at once: the worker is still importing PyMuPDF
        pid = ahead.worker_pid
        assert pid is not None and _pid_alive(pid)
        ahead.start()  # one worker, however often it is asked
        assert ahead.worker_pid == pid
        assert "Quarterly" in ahead.convert_page(report_pdf, 1).markdown
        assert ahead.worker_pid == pid  # the call used the worker started ahead

    with PdfProcessor() as ahead:
        ahead.start()
        dead = ahead.worker_pid
        os.kill(dead, signal.SIGKILL)  # dies before its "ready"
        assert ahead.inspect(report_pdf).page_count == 4  # the call starts a fresh worker, without a word
        assert ahead.worker_pid not in (None, dead) and not _pid_alive(dead)
        last = ahead.worker_pid
    assert not _pid_alive(last)


def test_a_worker_started_ahead_and_never_used_is_stopped_with_its_processor():
    ahead = PdfProcessor()
    ahead.start()
    pid = ahead.worker_pid
    ahead.close()  # before its "ready" was read
    assert not _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers signal 0; look at its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- configuration ---------------------------------------------------------------------
def test_document_error_survives_pickling():
    error = DocumentError("corrupt: cycle in page tree", "corrupt")
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.reason, clone.error_class, clone.retryable) == ("corrupt: cycle in page tree", "corrupt", False)
    with pytest.raises(ValueError):
        DocumentError("x", "bogus")


def test_limits_come_from_the_settings(monkeypatch):
    monkeypatch.setenv("DOCQUEUE_MAX_FILE_MB", "5")
    monkeypatch.setenv("DOCQUEUE_MAX_PAGES", "40")
    monkeypatch.setenv("DOCQUEUE_PAGE_TIMEOUT", "7.5")
    monkeypatch.setenv("DOCQUEUE_OCR_DPI", "150")
    limits = PdfLimits.from_config(Settings.from_env().storage)
    assert (limits.max_file_bytes, limits.max_pages, limits.page_timeout_s, limits.ocr_dpi) == (5 * 2**20, 40, 7.5, 150)
    assert OcrResource.from_settings(Settings.from_env()).limits() == limits
    monkeypatch.setenv("DOCQUEUE_MAX_PAGES", "lots")
    with pytest.raises(ValueError, match="DOCQUEUE_MAX_PAGES"):
        Settings.from_env()


def test_ocr_resource_builds_one_processor_with_overrides(monkeypatch, report_pdf: Path):
    resource = OcrResource(max_pages=3, ocr_dpi=150)
    limits = resource.limits()
    assert (limits.max_pages, limits.ocr_dpi) == (3, 150)
    processor = resource.get_processor()
    assert resource.get_processor() is processor
    try:
        _assert_fails(lambda: processor.inspect(report_pdf), "too_large", "too many pages: 4 > limit 3")
        worker = processor.worker_pid
        resource.teardown_after_execution(None)
        # the next run in this process finds the same worker, started once
        again = OcrResource(max_pages=3, ocr_dpi=150).get_processor()
        assert again is processor
        _assert_fails(lambda: again.inspect(report_pdf), "too_large", "too many pages: 4 > limit 3")
        assert worker is not None and again.worker_pid == worker
        assert OcrResource(max_pages=2, ocr_dpi=150).get_processor() is not processor
    finally:
        processor.close()
    assert processor.worker_pid is None


def test_the_shared_pdf_worker_goes_with_its_process(report_pdf: Path):
    """A run process's worker is never left behind: it exits with the process, or soon after a SIGKILL of it."""
    script = (
        "import sys\n"
        "from resources.ocr_resource import OcrResource\n"
        "processor = OcrResource().get_processor()\n"
        "processor.inspect(sys.argv[1])\n"
        "print(processor.worker_pid, flush=True)\n"
        "sys.stdin.readline()\n"  # the parent has seen the worker alive
        "if sys.argv[2] == 'hang':\n"
        "    import time; time.sleep(600)\n"
    )
    for ending in ("exit", "hang"):
        child = subprocess.Popen(
            [sys.executable, "-c", script, str(report_pdf), ending],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        worker = int(child.stdout.readline())
        assert _pid_alive(worker)
        child.stdin.write("\n")
        child.stdin.close()
        if ending == "hang":
            child.kill()
        child.wait(60)
        deadline = time.monotonic() + 10
        while _pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(worker), ending


def test_a_forked_child_starts_its_own_pdf_worker_and_leaves_the_parents(report_pdf: Path):
    """A child forked from a process with a shared worker (a Celery prefork slot) never talks to, or stops, the
    parent's worker."""
    processor = OcrResource().get_processor()
    assert processor.inspect(report_pdf).page_count == 4
    parent_worker = processor.worker_pid
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through its exit code)
        code = 1
        try:
            mine = OcrResource().get_processor()
            ok = mine is not processor and mine.inspect(report_pdf).page_count == 4
            code = 0 if ok and mine.worker_pid not in (None, parent_worker) else 2
            mine.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert processor.worker_pid == parent_worker
    assert processor.inspect(report_pdf).page_count == 4 and processor.worker_pid == parent_worker
