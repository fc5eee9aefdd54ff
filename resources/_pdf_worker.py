"""The PDF worker process behind resources.ocr.PdfProcessor.

Every PyMuPDF, pdfium and OCR call happens here, in a fresh interpreter
(``python -m resources._pdf_worker FD``: spawn semantics, never a fork of the caller)
whose address space is capped, so a hostile PDF can at worst kill this process.
The parent talks to it over a multiprocessing connection on file descriptor FD; the
first message carries the settings:

  request: {"op": "inspect" | "convert" | "stop", ...}
  reply:   ("ok", payload) or ("error", error_class, reason)

This module must stay importable without PyMuPDF/numpy side effects: heavy imports
happen in `serve`, after the memory cap and thread counts are in place.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEMORY_EXIT_CODE = 75  # the worker ran out of memory while it could not even reply
STARTUP_FAILED_EXIT_CODE = 76
BOILERPLATE_SAMPLE_PAGES = 40
MAX_PAGE_MARKDOWN_CHARS = 1_000_000
_PDF_SIGNATURE_WINDOW = 1024
# non-PDF content PyMuPDF lays out as pages; each is converted to a PDF once when opened
LAID_OUT_FILETYPES = frozenset({"png", "jpeg", "tiff", "epub", "xps"})

# ONNX Runtime gets its thread count explicitly; numpy's BLAS is off the hot path, and
# each idle OpenBLAS thread reserves address space that counts against the memory cap
THREAD_ENV_VARS = {
    "OMP_NUM_THREADS": None,
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


def main(argv: list[str]) -> None:
    """`argv`: [program, the pipe's file descriptor, the limits as JSON], both from the parent."""
    import json
    from multiprocessing.connection import Connection

    conn = Connection(int(argv[1]))
    serve(conn, json.loads(argv[2]))


def serve(conn, settings: dict) -> None:
    """Run the request loop until the parent says stop or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _limit_process(settings)
    try:
        worker = _Worker(settings)
    except BaseException as exc:  # report instead of dying silently
        try:
            conn.send(("failed", f"{type(exc).__name__}: {_short(str(exc))}"))
        finally:
            os._exit(MEMORY_EXIT_CODE if isinstance(exc, MemoryError) else STARTUP_FAILED_EXIT_CODE)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent went away
        if not isinstance(request, dict) or request.get("op") == "stop":
            # nothing is left to flush (replies go out as they are made): skipping the interpreter's teardown of the
            # OCR runtime saves the parent about 1.5 s of waiting per stop
            os._exit(0)
        try:
            conn.send(worker.handle(request))
        except MemoryError:
            os._exit(MEMORY_EXIT_CODE)
        except (BrokenPipeError, OSError):
            os._exit(0)


def _limit_process(settings: dict) -> None:
    import resource

    for name, value in THREAD_ENV_VARS.items():
        os.environ[name] = value or str(settings["threads"])
    cap = int(settings["memory_mb"]) * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


class WorkerFailure(Exception):
    def __init__(self, error_class: str, reason: str):
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


class NoPagesFound(WorkerFailure):
    """PyMuPDF opened the PDF but found no pages in it, or could not count them: worth a second opinion."""


@dataclass
class _OpenDocument:
    key: tuple
    password: str | None
    doc: Any
    page_count: int
    encrypted: bool
    repaired: bool
    sample: list[int]
    headers: Any = None
    engine: str = "pymupdf"


class _Worker:
    def __init__(self, settings: dict):
        # isort: off
        from resources.pymupdf_loader import pymupdf  # first: pymupdf4llm imports pymupdf too
        import pymupdf4llm

        # isort: on
        pymupdf.TOOLS.mupdf_display_errors(False)
        pymupdf.TOOLS.mupdf_display_warnings(False)
        pymupdf4llm.use_layout(False)  # the GNN layout engine is slower and trips over broken forms
        with contextlib.suppress(ImportError):
            import cv2

            cv2.setNumThreads(int(settings["threads"]))
        self.pymupdf = pymupdf
        self.settings = settings
        self._ocr = None
        self._open: _OpenDocument | None = None

    # -- dispatch -------------------------------------------------------
    def handle(self, request: dict) -> tuple:
        from resources._pdf_pages import PageConversionError, is_memory_error

        op = request.get("op")
        filetype = request.get("filetype") or "pdf"
        subject = f"page {request['page_number']}" if op == "convert" else "inspecting the document"
        try:
            if op == "inspect":
                return ("ok", self.inspect(request["path"], request.get("password"), filetype))
            if op == "convert":
                return (
                    "ok",
                    self.convert(
                        request["path"],
                        request.get("password"),
                        request["page_number"],
                        request.get("boilerplate") or (),
                        filetype,
                    ),
                )
            return ("error", "internal", f"internal: unknown worker request {op!r}")
        except (WorkerFailure, PageConversionError) as failure:
            return ("error", failure.error_class, failure.reason)
        except BaseException as exc:
            if is_memory_error(exc):
                self._close_document()
                cap = self.settings["memory_mb"]
                return ("error", "resource_limit", f"resource limit: {subject} exceeded the {cap} MB memory cap")
            return ("error", "internal", f"internal: {subject}: {type(exc).__name__}: {_short(str(exc))}")
        finally:
            try:
                self.pymupdf.TOOLS.store_shrink(100)  # drop MuPDF's resource cache between calls
            except Exception:
                pass

    # -- operations -----------------------------------------------------
    def inspect(self, path: str, password: str | None, filetype: str = "pdf") -> dict:
        from processing.page_cleanup import edge_lines, find_boilerplate

        state = self._document(path, password, filetype)
        edges = []
        for index in state.sample:
            text = self._page_text(state, index, sort=True)
            if text is not None:
                edges.append(edge_lines(text))
        return {
            "page_count": state.page_count,
            "encrypted": state.encrypted,
            "repaired": state.repaired,
            "boilerplate": find_boilerplate(edges),
            "metadata": _clean_metadata(state.doc),
            "engine": state.engine,
        }

    def convert(self, path: str, password: str | None, page_number: int, boilerplate, filetype: str = "pdf") -> dict:
        from processing.layer_trust import TRUST_SETTINGS, distrust_reason
        from processing.page_cleanup import meaningful_chars, strip_page_furniture
        from resources._pdf_pages import page_is_blank

        started = time.monotonic()
        state = self._document(path, password, filetype)
        if not 1 <= page_number <= state.page_count:
            raise WorkerFailure(
                "unsupported", f"unsupported: page {page_number} does not exist (document has {state.page_count} pages)"
            )
        index = page_number - 1
        page = self._load_page(state, index)
        layer = self._page_text(state, index, sort=False, strict=True) or ""
        layer_chars = meaningful_chars(layer)
        # a layer docqueue does not trust is read by OCR instead; the page's method names why, beside the engine
        distrusted = distrust_reason(layer, page.get_bboxlog, **{key: self.settings[key] for key in TRUST_SETTINGS})
        if layer_chars >= self.settings["min_text_chars"] and not distrusted:
            method, markdown = "text-layer", self._text_markdown(state, index)
        elif page_is_blank(page):
            method, markdown = "text-layer", ""
        else:
            engine = self._ocr_engine()
            markdown = engine.read_page(page, started)
            method = f"{engine.method}:{distrusted}" if distrusted else engine.method
            if not distrusted and layer_chars and meaningful_chars(markdown) < layer_chars:
                # a short real text layer beats an OCR pass that found even less
                method, markdown = "text-layer", self._text_markdown(state, index)
        markdown = strip_page_furniture(markdown, boilerplate)
        if len(markdown) > MAX_PAGE_MARKDOWN_CHARS:
            markdown = markdown[:MAX_PAGE_MARKDOWN_CHARS] + "\n\n[page truncated by docqueue]\n"
        return {"markdown": markdown, "method": method, "seconds": time.monotonic() - started}

    def _text_markdown(self, state: _OpenDocument, index: int) -> str:
        from resources._pdf_pages import HeaderSizes, text_layer_markdown

        if state.headers is None:
            state.headers = HeaderSizes(state.doc, state.sample)
        return text_layer_markdown(state.doc, index, state.headers)

    def _ocr_engine(self):
        if self._ocr is None:
            from resources._tesseract import ocr_engine

            self._ocr = ocr_engine(self.settings)
        return self._ocr

    # -- documents ------------------------------------------------------
    def _document(self, path: str, password: str | None, filetype: str = "pdf") -> _OpenDocument:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise WorkerFailure("internal", f"internal: file not found: {Path(path).name}") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns, filetype)
        if self._open is not None and self._open.key == key and self._open.password == password:
            return self._open
        self._close_document()
        self._open = self._open_document(path, password, key, stat.st_size, filetype)
        return self._open

    def _open_document(
        self, path: str, password: str | None, key: tuple, size: int, filetype: str = "pdf"
    ) -> _OpenDocument:
        if size == 0:
            raise WorkerFailure("empty", "empty: file is 0 bytes")
        if filetype != "pdf":
            return self._opened(self._open_as_pdf(path, filetype), password, key)
        if not _has_pdf_signature(path):
            raise WorkerFailure("unsupported", "unsupported: not a PDF file (no %PDF- header in the first 1 KiB)")
        return self._open_pdf(path, password, key)

    def _open_pdf(self, path: str, password: str | None, key: tuple) -> _OpenDocument:
        """PyMuPDF reads the PDF; when it cannot open it or finds no pages in it, pdfium is asked before the
        document fails. An encrypted PDF PyMuPDF opens stays PyMuPDF's to refuse without its password."""
        from resources._pdf_pages import is_memory_error

        try:
            doc = self.pymupdf.open(path, filetype="pdf")
        except Exception as exc:
            if is_memory_error(exc):
                raise
            reason = f"corrupt: cannot open as PDF ({_short(_without_path(str(exc), path))})"
            return self._second_opinion(path, password, key, WorkerFailure("corrupt", reason))
        try:
            return self._opened(doc, password, key)
        except NoPagesFound as failure:
            return self._second_opinion(path, password, key, failure)

    def _second_opinion(self, path: str, password: str | None, key: tuple, failure: WorkerFailure) -> _OpenDocument:
        """The pages pdfium reads, rebuilt into a PDF PyMuPDF opens; `failure`, PyMuPDF's verdict, when pdfium
        cannot read any either (its sentence then says so) or the fallback is off."""
        if self.settings["pdf_fallback"] != "pdfium":
            raise failure
        from resources._pdfium_rebuild import PdfiumFailure, PdfiumUnreadable, rebuild

        try:
            rebuilt = rebuild(path, password, int(self.settings["max_pages"]))
        except PdfiumFailure as verdict:
            raise WorkerFailure(verdict.error_class, verdict.reason) from None
        except PdfiumUnreadable as why:
            raise WorkerFailure(failure.error_class, f"{failure.reason}; {why}") from None
        try:
            doc = self.pymupdf.open("pdf", rebuilt.data)
            return self._opened(doc, password, key, engine="pdfium", encrypted=rebuilt.encrypted)
        except (NoPagesFound, self.pymupdf.FileDataError):
            raise WorkerFailure(failure.error_class, f"{failure.reason}; pdfium's copy of it is no better") from None

    def _opened(
        self, doc, password: str | None, key: tuple, engine: str = "pymupdf", encrypted: bool = False
    ) -> _OpenDocument:
        """`doc` authenticated and its pages counted, or closed and the reason raised. pdfium's copy carries no
        encryption of its own: `encrypted` says whether the original did."""
        try:
            encrypted = encrypted or bool(doc.needs_pass) or bool(doc.is_encrypted)
            if doc.needs_pass:
                if not password:
                    raise WorkerFailure("encrypted", "encrypted: password required")
                if not doc.authenticate(password):
                    raise WorkerFailure("encrypted", "encrypted: wrong password")
            page_count = self._checked_page_count(doc)
            return _OpenDocument(
                key=key,
                password=password,
                doc=doc,
                page_count=page_count,
                encrypted=encrypted,
                repaired=bool(doc.is_repaired) or engine != "pymupdf",
                sample=_sample_pages(page_count, BOILERPLATE_SAMPLE_PAGES),
                engine=engine,
            )
        except BaseException:
            doc.close()
            raise

    def _open_as_pdf(self, path: str, filetype: str):
        """An image, TIFF, EPUB or XPS as an in-memory PDF of the pages PyMuPDF lays out. Page copies, xrefs and
        the text-layer converter only exist for PDFs (a non-PDF page's xref even crashes MuPDF), so the rest of
        the worker only ever sees PDFs. The page limit is checked before the conversion does the work."""
        from resources._pdf_pages import is_memory_error

        if filetype not in LAID_OUT_FILETYPES:
            raise WorkerFailure("unsupported", f"unsupported: file type {filetype!r} is not read")
        try:
            source = self.pymupdf.open(path, filetype=filetype)
        except Exception as exc:
            if is_memory_error(exc):
                raise
            raise WorkerFailure(
                "corrupt", f"corrupt: cannot open as {filetype.upper()} ({_short(_without_path(str(exc), path))})"
            ) from None
        try:
            count = source.page_count
            limit = int(self.settings["max_pages"])
            if count > limit:
                raise WorkerFailure("too_large", f"too many pages: {count} > limit {limit}")
            if count == 0:
                raise WorkerFailure("empty", f"empty: the {filetype.upper()} has no pages")
            return self.pymupdf.open("pdf", source.convert_to_pdf())
        except WorkerFailure:
            raise
        except Exception as exc:
            if is_memory_error(exc):
                raise
            raise WorkerFailure(
                "corrupt", f"corrupt: cannot lay out the {filetype.upper()} ({_short(_without_path(str(exc), path))})"
            ) from None
        finally:
            source.close()

    def _checked_page_count(self, doc) -> int:
        try:
            count = doc.page_count
        except Exception as exc:
            raise NoPagesFound("corrupt", f"corrupt: cannot count pages ({_short(str(exc))})") from None
        limit = int(self.settings["max_pages"])
        if count > limit:
            raise WorkerFailure("too_large", f"too many pages: {count} > limit {limit}")
        if count == 0:
            if doc.is_repaired:
                raise NoPagesFound("corrupt", "corrupt: no pages could be recovered (the file needed repair)")
            raise NoPagesFound("empty", "empty: document has no pages")
        _check_page_tree(doc, node_budget=4 * limit + 64)
        return count

    def _load_page(self, state: _OpenDocument, index: int):
        from resources._pdf_pages import is_memory_error

        try:
            page = state.doc.load_page(index)
            if page.xref:
                # MuPDF shows a page whose dictionary fails to parse (e.g. nested too deep)
                # as an empty page; reading the object surfaces the real error
                state.doc.xref_get_keys(page.xref)
            return page
        except Exception as exc:
            if is_memory_error(exc):
                raise
            raise WorkerFailure("corrupt", f"corrupt: page {index + 1} cannot be read ({_short(str(exc))})") from None

    def _page_text(self, state: _OpenDocument, index: int, sort: bool, strict: bool = False) -> str | None:
        """Plain text of a page; None for an unreadable page unless `strict`."""
        from resources._pdf_pages import is_memory_error

        try:
            return self._load_page(state, index).get_text("text", sort=sort)
        except WorkerFailure:
            if strict:
                raise
            return None
        except Exception as exc:
            if is_memory_error(exc):
                raise
            if strict:
                raise WorkerFailure(
                    "corrupt", f"corrupt: page {index + 1} text cannot be read ({_short(str(exc))})"
                ) from None
            return None

    def _close_document(self) -> None:
        if self._open is not None:
            try:
                self._open.doc.close()
            except Exception:
                pass
            self._open = None


# -- helpers ----------------------------------------------------------------
_REFERENCE = re.compile(r"(\d+)\s+\d+\s+R")


def _check_page_tree(doc, node_budget: int) -> None:
    """Walk /Pages depth-first and fail on a node that is its own ancestor.

    MuPDF's page count trusts /Count, and a cycle only surfaces when a page inside it
    is loaded; finding it here turns it into one clear document-level error.
    """
    try:
        kind, value = doc.xref_get_key(doc.pdf_catalog(), "Pages")
    except Exception:
        return  # no classic catalog (e.g. rebuilt by repair): MuPDF's own lookup decides
    if kind != "xref":
        return
    root = int(value.split()[0])
    path, on_path = [root], {root}
    pending = [iter(_kids(doc, root))]
    visited = 0
    while pending:
        child = next(pending[-1], None)
        if child is None:
            pending.pop()
            on_path.discard(path.pop())
            continue
        if child in on_path:
            raise WorkerFailure("corrupt", "corrupt: cycle in page tree")
        visited += 1
        if visited > node_budget:
            return  # bounded: a tree this big is already limited by max_pages
        grandchildren = _kids(doc, child)
        if grandchildren:
            path.append(child)
            on_path.add(child)
            pending.append(iter(grandchildren))


def _kids(doc, xref: int) -> list[int]:
    try:
        kind, value = doc.xref_get_key(xref, "Kids")
        if kind == "xref":
            value = doc.xref_object(int(value.split()[0]), compressed=True)
        elif kind != "array":
            return []
    except Exception:
        return []
    return [int(number) for number in _REFERENCE.findall(value)]


def _sample_pages(page_count: int, limit: int) -> list[int]:
    """0-based pages spread evenly over the document, first and last included."""
    if page_count <= limit:
        return list(range(page_count))
    step = (page_count - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _has_pdf_signature(path: str) -> bool:
    with open(path, "rb") as handle:
        return b"%PDF-" in handle.read(_PDF_SIGNATURE_WINDOW)


def _clean_metadata(doc) -> dict:
    raw = doc.metadata or {}
    return {key: value.strip()[:500] for key, value in raw.items() if isinstance(value, str) and value.strip()}


def _without_path(message: str, path: str) -> str:
    return message.replace(str(path), Path(path).name)


def _short(message: str, limit: int = 200) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 1] + "…"


if __name__ == "__main__":
    import sys

    main(sys.argv)
