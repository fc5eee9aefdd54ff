"""Tesseract as the OCR engine of the PDF worker, for the languages DOCQUEUE_OCR_LANGUAGES names (run inside the
worker process only).

RapidOCR's bundled model reads Latin script only; Debian's `tesseract` program reads any script it has language
data for (`tesseract-ocr-rus` and the like). Each page is rendered in grey within the same pixel bound as for
RapidOCR and handed to one `tesseract` process through a pipe. That process inherits the worker's address-space
cap and thread count (RLIMIT_AS and OMP_NUM_THREADS, set by the worker before anything runs), and runs under
coreutils' `timeout`, so even a worker killed mid-page leaves no Tesseract running past the page's time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from processing.ocr_layout import render_zoom, tesseract_markdown
from resources._pdf_pages import OcrEngine, PageConversionError
from resources.pymupdf_loader import pymupdf

METHOD = "ocr:tesseract"
LIST_TIMEOUT_S = 30.0
# seconds of the page's time kept back for the worker's reply, so a slow page ends as this module's timeout
# sentence rather than as the worker being killed by its parent
REPLY_MARGIN_S = 1.0
MIN_BUDGET_S = 1.0
_MEMORY_WORDS = ("bad_alloc", "out of memory", "cannot allocate", "failed to allocate")


def ocr_engine(settings: dict) -> "OcrEngine | TesseractEngine":
    """The engine the worker's settings choose: Tesseract when DOCQUEUE_OCR_LANGUAGES names languages, else
    RapidOCR. Both answer `read_page(page, started)` and name themselves as a page's `method`."""
    if settings.get("ocr_languages"):
        return TesseractEngine(settings)
    return OcrEngine(settings)


class TesseractEngine:
    """Reads a page with `tesseract -l LANGUAGES`; checks once that the program and its language data are there."""

    method = METHOD

    def __init__(self, settings: dict):
        self.languages = str(settings["ocr_languages"])
        self.dpi = int(settings["ocr_dpi"])
        self.max_pixels = int(settings["max_render_pixels"])
        self.page_timeout_s = float(settings["page_timeout_s"])
        self.memory_mb = int(settings["memory_mb"])
        program = shutil.which("tesseract")
        if program is None:
            raise PageConversionError(
                "internal",
                f"internal: DOCQUEUE_OCR_LANGUAGES={self.languages} asks for Tesseract, but the tesseract program "
                f"is not installed (Debian: apt-get install tesseract-ocr {_packages(self.languages)})",
            )
        self.program = program
        self.timeout = shutil.which("timeout")
        missing = [name for name in self.languages.split("+") if name not in self._installed_languages()]
        if missing:
            raise PageConversionError(
                "internal",
                f"internal: Tesseract has no data for {', '.join(missing)} (DOCQUEUE_OCR_LANGUAGES="
                f"{self.languages}; Debian: apt-get install {_packages('+'.join(missing))})",
            )

    def read_page(self, page: pymupdf.Page, started: float) -> str:
        """The page's markdown; `started` is when the worker began the page (time.monotonic), which the page's
        time limit counts from."""
        png = self._render(page)
        budget = max(MIN_BUDGET_S, self.page_timeout_s - (time.monotonic() - started) - REPLY_MARGIN_S)
        command = [self.program, "stdin", "stdout", "-l", self.languages, "--psm", "3", "tsv"]
        if self.timeout:
            command = [self.timeout, "-s", "KILL", f"{budget:.1f}", *command]
        subject = f"page {page.number + 1}"
        begun = time.monotonic()
        # `timeout` ends it at `budget`; the limit here is for a `timeout` that does not
        done = _run(command, png, budget + 2)
        if done is None:
            raise _timeout(subject, self.page_timeout_s)
        if done.returncode != 0:
            raise _failure(done, subject, (budget, self.page_timeout_s), time.monotonic() - begun, self.memory_mb)
        return tesseract_markdown(done.stdout.decode("utf-8", errors="replace"))

    def _render(self, page: pymupdf.Page) -> bytes:
        rect = page.rect
        zoom = render_zoom(rect.width, rect.height, self.dpi, self.max_pixels)
        pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csGRAY, alpha=False)
        return pix.tobytes("png")

    def _installed_languages(self) -> set[str]:
        try:
            done = subprocess.run(
                [self.program, "--list-langs"], capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PageConversionError(
                "internal", f"internal: tesseract --list-langs did not answer ({type(exc).__name__})"
            ) from None
        # the first line names the data folder; the rest are the languages, one a line
        return {line.strip() for line in done.stdout.splitlines()[1:] if line.strip()}


def _packages(languages: str) -> str:
    return " ".join(f"tesseract-ocr-{name.lower().replace('_', '-')}" for name in languages.split("+"))


def _run(command: list[str], data: bytes, limit: float) -> subprocess.CompletedProcess | None:
    """`command` fed `data`, in a process group of its own; None, with the whole group killed, past `limit`."""
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = process.communicate(data, timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return None
    except BaseException:
        _kill_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # `timeout` and the tesseract under it
    except ProcessLookupError:
        pass
    process.communicate()


def _timeout(subject: str, page_timeout_s: float) -> PageConversionError:
    return PageConversionError("timeout", f"timeout: {subject} took more than {page_timeout_s:g} s (Tesseract stopped)")


def _failure(
    done: subprocess.CompletedProcess, subject: str, times: tuple[float, float], took: float, memory_mb: int
) -> PageConversionError:
    """`times`: Tesseract's budget and the page's time limit."""
    said = done.stderr.decode("utf-8", errors="replace")
    killed = done.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    if killed and took >= times[0] - 0.5:
        return _timeout(subject, times[1])
    if killed or any(word in said.lower() for word in _MEMORY_WORDS):
        return PageConversionError(
            "resource_limit", f"resource limit: Tesseract exceeded the {memory_mb} MB memory cap on {subject}"
        )
    last = next((line.strip() for line in reversed(said.splitlines()) if line.strip()), "no message")
    return PageConversionError(
        "internal", f"internal: Tesseract failed on {subject} (exit code {done.returncode}: {last[:200]})"
    )
