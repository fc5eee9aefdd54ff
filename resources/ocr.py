"""OCR phase: PDF page -> markdown, with every PDF/OCR call isolated in a worker process.

`PdfProcessor` owns one persistent worker: a fresh interpreter running
`resources._pdf_worker` (spawn semantics -- never a fork of the caller -- but without
multiprocessing's re-import of the caller's ``__main__``, which re-runs unguarded
scripts), its address space capped with RLIMIT_AS. A call that runs past `page_timeout_s` kills the worker
(the next call starts a fresh one) and raises `DocumentError("timeout: ...")`; a worker
that dies raises `resource_limit` or `internal`. The calling process only waits on a
pipe, so its other threads (heartbeats) keep running while a page is converted.

Failures always arrive as `DocumentError` with a short readable `reason`, an
`error_class` and whether retrying can help.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from processing.errors import DocumentError
from resources import _pdf_worker
from resources.pdf_limits import MB, PdfLimits

WORKER_RECYCLE_AFTER_CALLS = 500  # fresh worker now and then: MuPDF/ONNX caches only grow
_POLL_INTERVAL_S = 0.25
_STOP_GRACE_S = 3.0


@dataclass
class DocumentInfo:
    page_count: int
    encrypted: bool
    repaired: bool
    boilerplate: list[str] = field(default_factory=list)  # normalised header/footer lines, see processing.page_cleanup
    metadata: dict = field(default_factory=dict)
    engine: str | None = None  # what read the pages: "pymupdf", or "pdfium" when PyMuPDF found none


@dataclass
class PageResult:
    page_number: int
    markdown: str
    # "text-layer", or "ocr:rapidocr" / "ocr:tesseract" (DOCQUEUE_OCR_LANGUAGES set), with ":<reason>" when a text
    # layer was not trusted (processing/layer_trust.py: "unmapped-layer", "lookalike-layer")
    method: str
    chars: int
    seconds: float


class _WorkerHandle:
    """The worker process and its pipe; kept apart from PdfProcessor so a finalizer can stop it."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.conn = None
        self.calls = 0
        self.started = 0.0  # time.monotonic() at its start
        self.ready = False  # its "ready" was read (a worker started by PdfProcessor.start has not said it yet)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def forget(self) -> tuple[subprocess.Popen | None, Any]:
        """No worker held any more; returns the process and pipe it held, for the caller to end or let go."""
        process, conn = self.process, self.conn
        self.process, self.conn, self.calls, self.ready = None, None, 0, False
        return process, conn

    def kill(self) -> None:
        process, conn = self.forget()
        if process is not None:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            if self.alive and self.conn is not None:
                self.conn.send({"op": "stop"})
                self.process.wait(_STOP_GRACE_S)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()


class PdfProcessor:
    """Inspect PDFs and convert single pages to markdown in an isolated worker process."""

    def __init__(self, limits: PdfLimits | None = None):
        self.limits = limits or PdfLimits()
        self._lock = threading.Lock()
        self._worker = _WorkerHandle()
        self._finalizer = weakref.finalize(self, self._worker.stop)

    # -- public API -------------------------------------------------------
    def inspect(self, path: str | Path, password: str | None = None, filetype: str = "pdf") -> DocumentInfo:
        """`filetype` is PyMuPDF's name for the content (pdf, png, jpeg, tiff, epub, xps, ...)."""
        checked = self._checked_path(path)
        payload = self._call(
            {"op": "inspect", "path": checked, "password": password, "filetype": filetype}, "inspecting the document"
        )
        return DocumentInfo(**payload)

    def convert_page(
        self,
        path: str | Path,
        page_number: int,
        password: str | None = None,
        boilerplate: Iterable[str] = (),
        filetype: str = "pdf",
    ) -> PageResult:
        if isinstance(page_number, bool) or not isinstance(page_number, int) or page_number < 1:
            raise ValueError(f"page_number is 1-based, got {page_number!r}")
        checked = self._checked_path(path)
        request = {
            "op": "convert",
            "path": checked,
            "password": password,
            "page_number": page_number,
            "boilerplate": list(boilerplate),
            "filetype": filetype,
        }
        payload = self._call(request, f"page {page_number}")
        markdown = payload["markdown"]
        return PageResult(page_number, markdown, payload["method"], len(markdown), payload["seconds"])

    @property
    def worker_pid(self) -> int | None:
        """Process id of the current worker (None before the first call or after a kill)."""
        process = self._worker.process
        return process.pid if self._worker.alive else None

    def start(self) -> None:
        """Start the worker process now, without waiting for it: its start-up (an interpreter and PyMuPDF's import)
        then goes on beside the caller's own (a runner planning and launching its first run), and the first call
        waits for whatever is left of it. A start that fails here is tried again, and reported, by that call."""
        with self._lock:
            if not self._worker.alive:
                try:
                    self._spawn_worker()
                except DocumentError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._worker.stop()

    def forget_inherited_worker(self) -> None:
        """In a forked child: the worker and its pipe are the parent's. Drop this copy's hold on them without a word
        to the worker (a stop, or this object's finalizer at the child's exit, would end the parent's worker)."""
        self._finalizer.detach()
        _, conn = self._worker.forget()
        if conn is not None:
            conn.close()  # the child's copy of the descriptor only

    def __enter__(self) -> "PdfProcessor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- internals --------------------------------------------------------
    def _checked_path(self, path: str | Path) -> str:
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise DocumentError(f"internal: file not found: {Path(path).name}", "internal") from None
        if size > self.limits.max_file_bytes:
            raise DocumentError(
                f"too large: {_megabytes(size)} MB > limit {_megabytes(self.limits.max_file_bytes)} MB", "too_large"
            )
        return str(Path(path).resolve())

    def _call(self, request: dict, subject: str) -> dict:
        timeout = self.limits.page_timeout_s
        with self._lock:
            if self._worker.calls >= WORKER_RECYCLE_AFTER_CALLS:
                self._worker.stop()
            try:
                self._send(request)
                reply = self._wait_for_reply(timeout, subject)
                status, *details = reply
            except DocumentError:
                raise
            except Exception as exc:
                self._worker.kill()
                raise DocumentError(
                    f"internal: PDF worker exchange failed ({type(exc).__name__})", "internal"
                ) from None
            except BaseException:
                # interrupted mid-call (Ctrl-C, run termination): the worker's late reply
                # would otherwise be read as the answer to the next request
                self._worker.kill()
                raise
            self._worker.calls += 1
            if status == "ok":
                return details[0]
            error_class, reason = details
            if error_class == "resource_limit":
                self._worker.kill()  # after an allocation failure the worker's state is suspect
        raise DocumentError(reason, error_class)

    def _send(self, request: dict) -> None:
        for attempt in (1, 2):
            spawned = not self._worker.alive
            if spawned:
                self._spawn_worker()
            if not self._worker.ready:  # spawned here, or started ahead by start()
                try:
                    self._await_ready()
                except DocumentError:
                    if spawned:
                        raise
                    continue  # started ahead, it died before this call: one fresh start, as for one dead while idle
            try:
                self._worker.conn.send(request)
                return
            except (BrokenPipeError, EOFError, OSError):
                self._worker.kill()  # died while idle; one fresh start is worth it
                if attempt == 2:
                    raise DocumentError("internal: PDF worker is not accepting requests", "internal") from None

    def _wait_for_reply(self, timeout: float, subject: str):
        conn, process = self._worker.conn, self._worker.process
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._worker.kill()
                raise DocumentError(f"timeout: {subject} took more than {_seconds(timeout)} s", "timeout")
            if conn.poll(min(remaining, _POLL_INTERVAL_S)):
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    break
            elif process.poll() is not None:
                break
        raise self._death_error(process, subject)

    def _death_error(self, process: subprocess.Popen, subject: str) -> DocumentError:
        try:
            code = process.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        self._worker.kill()
        if code == _pdf_worker.MEMORY_EXIT_CODE or code == -signal.SIGKILL:
            # SIGKILL that we did not send is the kernel's OOM killer
            return DocumentError(
                f"resource limit: {subject} exceeded the {self.limits.max_memory_mb} MB memory cap", "resource_limit"
            )
        return DocumentError(f"internal: PDF worker crashed ({_exit_description(code)}) during {subject}", "internal")

    def _spawn_worker(self) -> None:
        """A new worker process (any old one killed first); its "ready" is read by _await_ready."""
        self._worker.kill()
        parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
        child_fd = child_conn.fileno()
        try:
            # the limits go on the command line: the worker reads nothing from its environment
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WORKER_BOOT,
                    _PROJECT_ROOT,
                    str(child_fd),
                    json.dumps(self.limits.worker_settings()),
                ],
                pass_fds=(child_fd,),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as exc:
            parent_conn.close()
            raise DocumentError(f"internal: cannot start the PDF worker ({exc})", "internal") from None
        finally:
            child_conn.close()
        self._worker.process, self._worker.conn, self._worker.calls = process, parent_conn, 0
        self._worker.started = time.monotonic()

    def _await_ready(self) -> None:
        """Read the worker's "ready", within DOCQUEUE_WORKER_START_TIMEOUT of its start."""
        process, parent_conn = self._worker.process, self._worker.conn
        left = self.limits.worker_start_timeout_s - (time.monotonic() - self._worker.started)
        if not parent_conn.poll(max(left, 0.0)):
            self._worker.kill()
            raise DocumentError(
                f"internal: PDF worker did not start within {_seconds(self.limits.worker_start_timeout_s)} s",
                "internal",
            )
        try:
            message = parent_conn.recv()
        except (EOFError, OSError):
            raise self._death_error(process, "worker start-up") from None
        if message[0] != "ready":
            self._worker.kill()
            error_class = "resource_limit" if "MemoryError" in message[1] else "internal"
            raise DocumentError(
                f"{error_class.replace('_', ' ')}: PDF worker failed to start ({message[1]})", error_class
            )
        self._worker.ready = True


# A fresh interpreter with the folder holding `resources` first on its path, whatever the caller's PYTHONPATH.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_WORKER_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from resources._pdf_worker import main; main(sys.argv[1:])"


def _megabytes(size: int) -> str:
    value = size / MB
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _seconds(value: float) -> str:
    return f"{value:g}"


def _exit_description(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
