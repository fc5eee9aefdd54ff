"""Page-level conversion, run inside the PDF worker process only.

Text layer -> markdown through pymupdf4llm's classic ("rag") engine on a one-page copy
of the page (that engine scans the whole document for annotations and the outline on
every call, which would make a 2000-page document quadratic); a small converter of our
own takes over when pymupdf4llm raises. Pages without a usable text layer are rendered
and read by RapidOCR with the models that ship inside its wheel (or by Tesseract: resources/_tesseract.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from statistics import median

import numpy as np

from processing.ocr_layout import OcrBox, boxes_to_markdown, render_zoom
from processing.page_cleanup import recover_missing_blocks
from resources.pymupdf_loader import pymupdf

GRAPHICS_LIMIT = 5000  # vector paths on a page beyond which pymupdf4llm ignores drawings (table search)
OCR_MAX_SIDE = 2400  # px; RapidOCR shrinks bigger images, which also bounds detector memory
BLANK_PROBE_ZOOM = 0.2


class PageConversionError(Exception):
    """A page-level failure with a readable reason; the worker maps it to a DocumentError."""

    def __init__(self, error_class: str, reason: str):
        super().__init__(reason)
        self.error_class = error_class
        self.reason = reason


# -- render ---------------------------------------------------------------
def page_is_blank(page: pymupdf.Page) -> bool:
    """Nothing drawn at all: skip OCR (a tiny render is much cheaper than detection)."""
    rect = page.rect
    if rect.is_empty or rect.width < 1 or rect.height < 1:
        return True
    zoom = min(BLANK_PROBE_ZOOM, 400 / max(rect.width, rect.height))
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csGRAY, alpha=False)
    return bool(pix.is_unicolor)


def render_for_ocr(page: pymupdf.Page, dpi: int, max_pixels: int) -> np.ndarray:
    """BGR image of the page (the channel order OpenCV-based RapidOCR expects)."""
    rect = page.rect
    zoom = render_zoom(rect.width, rect.height, dpi, max_pixels)
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False)
    rgb = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height, pix.width, pix.n)
    return np.ascontiguousarray(rgb[:, :, ::-1])


# -- OCR ------------------------------------------------------------------
class OcrEngine:
    """RapidOCR with the wheel's bundled detector and recogniser; never downloads. `settings` are the worker's."""

    method = "ocr:rapidocr"

    def __init__(self, settings: dict):
        import rapidocr

        threads = int(settings["threads"])
        self.dpi, self.max_pixels = int(settings["ocr_dpi"]), int(settings["max_render_pixels"])

        _forbid_model_downloads()
        models = Path(rapidocr.__file__).resolve().parent / "models"
        det = _single(models, "*det*.onnx")
        rec = _single(models, "*rec*.onnx")
        self._engine = rapidocr.RapidOCR(
            params={
                "Global.use_cls": False,
                "Global.log_level": "error",
                "Global.max_side_len": OCR_MAX_SIDE,
                # the detector sees the page at most 1280 px on its long side (the recogniser still reads the
                # full-resolution crops): measured here 2x less CPU per page at the same word recall
                # (1.000 generated page, 0.963 ocrmypdf__linn.pdf)
                "Det.limit_type": "max",
                "Det.limit_side_len": 1280,
                "Det.model_path": str(det),
                "Rec.model_path": str(rec),
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            }
        )

    def read_page(self, page: pymupdf.Page, started: float) -> str:
        """The page's markdown (`started` is for engines that bound their own time; the worker's parent bounds
        this one's)."""
        return self.read(render_for_ocr(page, self.dpi, self.max_pixels))

    def read(self, image: np.ndarray) -> str:
        result = self._engine(image)
        if result.boxes is None or not result.txts:
            return ""
        boxes = [
            OcrBox(tuple((float(x), float(y)) for x, y in quad), text)  # type: ignore[arg-type]
            for quad, text in zip(result.boxes, result.txts)
        ]
        return boxes_to_markdown(boxes)


def _single(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise PageConversionError("internal", f"internal: OCR model {pattern} missing from the rapidocr wheel")
    return found[0]


def _forbid_model_downloads() -> None:
    """Turn any attempt by RapidOCR to fetch a model or dictionary into an error."""
    from rapidocr.utils import download_file

    def refuse(*_args, **_kwargs):
        raise PageConversionError(
            "internal", "internal: RapidOCR tried to download a file; models must ship in the wheel"
        )

    download_file.DownloadFile.run = classmethod(refuse)  # type: ignore[assignment]


# -- text layer -------------------------------------------------------------
class HeaderSizes:
    """Font size -> markdown heading level, learnt once per document from sampled pages.

    The same sample is used for every page, so a page converts identically whatever was
    converted before it.
    """

    def __init__(self, doc: pymupdf.Document, sample: list[int]):
        from pymupdf4llm.helpers.pymupdf_rag import IdentifyHeaders

        self._headers = IdentifyHeaders(doc, pages=sample)
        self.body_size = self._headers.body_limit

    def get_header_id(self, span: dict, page=None) -> str:
        return self._headers.get_header_id(span, page=page)


def text_layer_markdown(doc: pymupdf.Document, index: int, headers: HeaderSizes) -> str:
    import pymupdf4llm

    page = doc.load_page(index)
    single = pymupdf.open()
    try:
        single.insert_pdf(doc, from_page=index, to_page=index)
        drawn = draws_paths(single[0])
        markdown = pymupdf4llm.to_markdown(
            single,
            pages=[0],
            hdr_info=headers,
            ignore_images=True,
            # a page without paths has no tables or graphics to find, nor fills to tell from its background
            ignore_graphics=not drawn,
            detect_bg_color=drawn,
            graphics_limit=GRAPHICS_LIMIT,
            show_progress=False,
        )
    except MemoryError:
        raise
    except Exception as exc:  # pymupdf4llm trips over some real-world files
        if is_memory_error(exc):
            raise
        return fallback_markdown(page, headers.body_size)
    finally:
        single.close()
    blocks = [block[4] for block in page.get_text("blocks", sort=True) if block[6] == 0]
    return recover_missing_blocks(markdown, blocks)


def draws_paths(page: pymupdf.Page) -> bool:
    """Whether the page draws any vector path. pymupdf4llm's table search finds tables by drawn lines alone
    ("lines_strict"), so a page without paths holds none it could find, yet the search reads every character of
    the page before it looks for lines, the largest part of converting a plain text page; and its background
    colour, read from four small renderings, only tells filled paths from the page."""
    return any("path" in kind for kind, _ in page.get_bboxlog())


_BULLETS = ("•", "●", "▪", "◦", "‣", "⁃", "·", "-", "–", "*")
_NUMBERED = re.compile(r"^\(?\d{1,3}[.)]\s")


def fallback_markdown(page: pymupdf.Page, body_size: float) -> str:
    """Headings by font size, bullets as list items, other lines as paragraphs."""
    blocks = page.get_text("dict", sort=True, flags=pymupdf.TEXTFLAGS_TEXT)["blocks"]
    out: list[str] = []
    for block in blocks:
        lines = []
        sizes = []
        for line in block.get("lines", []):
            spans = [span for span in line["spans"] if span["text"].strip()]
            if not spans:
                continue
            lines.append("".join(span["text"] for span in line["spans"]).strip())
            sizes.append(median(span["size"] for span in spans))
        if not lines:
            continue
        size = median(sizes)
        text = " ".join(lines)
        if size >= 1.6 * body_size and len(text) <= 200:
            out.append("# " + text)
        elif size >= 1.2 * body_size and len(text) <= 200:
            out.append("## " + text)
        elif all(line.startswith(_BULLETS) or _NUMBERED.match(line) for line in lines[:1]):
            out.extend(_list_item(line) for line in lines)
        else:
            out.append(text)
    return "\n\n".join(out)


def _list_item(line: str) -> str:
    if line.startswith(_BULLETS):
        return "- " + line[1:].strip()
    return line


# -- error classification -----------------------------------------------
_MEMORY_WORDS = (
    "out of memory",
    "malloc",
    "bad_alloc",
    "cannot allocate",
    "insufficient memory",
    "failed to allocate",
    "failed to map segment",  # dlopen of a shared library under RLIMIT_AS
)


def is_memory_error(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    memory_cls = getattr(getattr(pymupdf, "mupdf", None), "FzErrorMemory", None)
    if memory_cls is not None and isinstance(exc, memory_cls):
        return True
    message = str(exc).lower()
    return any(word in message for word in _MEMORY_WORDS)
