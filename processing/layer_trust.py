"""Which pages' text layers docqueue does not trust, and why: such a page is read by OCR instead.

Pure logic, no PDF library. The PDF worker (resources/_pdf_worker.py) and the planted-copies bench
(bench/_planted.py) hand `distrust_reason` a page's text and, only when the text alone raises the question, the
page's drawing log (PyMuPDF's `Page.get_bboxlog()`: (kind, bbox) pairs in painting order), so one rule decides for
both. Two reasons:

  unmapped-layer   most of the layer's characters are codes its fonts could not map to unicode
                   (page_cleanup.unmapped_share above DOCQUEUE_MAX_UNMAPPED_SHARE)
  lookalike-layer  the layer is an earlier OCR that read a Cyrillic or Greek print as Latin look-alike letters:
                   DOCQUEUE_OCR_LANGUAGES names a language of such a script, the layer's text is hidden (an earlier
                   OCR's: invisible, render mode 3, or painted under the picture of the page), and more than
                   DOCQUEUE_MAX_LOOKALIKE_SHARE of its words are misshapen Latin words

A misshapen word is a word of Latin letters whose case is none of lower, UPPER or Title: `AeKnapai`, `CyMMa`,
`npVIMeHeHVIeM`. Cyrillic lower-case letters whose glyphs are small capitals (в к м н т) come out of a Latin-only
OCR as capitals inside lower-case words: `Налоговая декларация` reads as `Hanorosas AeKnapai`. Prose that people
wrote holds such words only as names (JavaScript, McCloskey: at most 3 % of a page's words in ../shared/corpus),
and code, which holds many (getElementById), is visible text, never an earlier OCR's hidden layer. The score
reads text the worker has already extracted; the drawing log is asked for only on pages the score flags.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Iterable, Sequence

from processing.page_cleanup import unmapped_share

UNMAPPED = "unmapped-layer"
LOOKALIKE = "lookalike-layer"

# Tesseract's languages written in a script whose letters an OCR reading Latin takes for Latin look-alikes
LOOKALIKE_SCRIPT_LANGUAGES = frozenset(
    {
        # Cyrillic
        "aze_cyrl",
        "bel",
        "bul",
        "kaz",
        "kir",
        "mkd",
        "mon",
        "rus",
        "srp",
        "tat",
        "tgk",
        "ukr",
        "uzb_cyrl",
        # Greek
        "ell",
        "grc",
    }
)
# the PDF worker's settings `distrust_reason` takes, by the same names
TRUST_SETTINGS = ("max_unmapped_share", "max_lookalike_share", "ocr_languages")
MIN_WORDS = 20  # fewer cased words than this (a label, a stamp) are too few to judge a layer by
HIDDEN_TEXT_SHARE = 0.5  # most of a page's text drawn hidden: the layer is an earlier OCR's
_COVER_TOLERANCE = 1.0  # points a text box may stick out of the picture it is painted under
_LETTERS = re.compile(r"[^\W\d_]{2,}")

Box = Sequence[float]
DrawingLog = Iterable[tuple[str, Box]]


def reads_lookalike_script(ocr_languages: str) -> bool:
    """Whether DOCQUEUE_OCR_LANGUAGES (`eng+rus`) names a language of a script with Latin look-alike letters."""
    return any(name in LOOKALIKE_SCRIPT_LANGUAGES for name in ocr_languages.split("+") if name)


def _latin(word: str) -> bool:
    return all(unicodedata.name(ch, "").startswith("LATIN") for ch in word)


def _cased(word: str) -> bool:
    return word.lower() != word.upper()


def lookalike_share(text: str) -> float:
    """The share of a layer's cased words of two letters or more that are misshapen Latin words (case none of
    lower, UPPER, Title); 0 for a layer of fewer than MIN_WORDS cased words."""
    words = [word for word in _LETTERS.findall(text) if _cased(word)]
    if len(words) < MIN_WORDS:
        return 0.0
    misshapen = sum(1 for w in words if not (w.islower() or w.isupper() or w.istitle()) and _latin(w))
    return misshapen / len(words)


def hidden_text_share(drawing_log: DrawingLog) -> float:
    """The share of a page's text drawings a reader does not see: invisible text (render mode 3, `ignore-text`), or
    text a later picture covers (a scanner's layer painted under the scan). 0 for a page without text."""
    log = list(drawing_log)
    pictures = [(index, box) for index, (kind, box) in enumerate(log) if kind == "fill-image"]
    texts = hidden = 0
    for index, (kind, box) in enumerate(log):
        if not kind.endswith("-text"):
            continue
        texts += 1
        if kind == "ignore-text" or any(later > index and _inside(box, picture) for later, picture in pictures):
            hidden += 1
    return hidden / texts if texts else 0.0


def _inside(box: Box, outer: Box) -> bool:
    t = _COVER_TOLERANCE
    return box[0] >= outer[0] - t and box[1] >= outer[1] - t and box[2] <= outer[2] + t and box[3] <= outer[3] + t


def distrust_reason(
    text: str,
    drawing_log: Callable[[], DrawingLog],
    *,
    max_unmapped_share: float,
    max_lookalike_share: float,
    ocr_languages: str,
) -> str | None:
    """Why the page's text layer `text` is not to be read as text (UNMAPPED, LOOKALIKE), or None to trust it.
    `drawing_log` is called only when the text alone flags a look-alike layer."""
    if unmapped_share(text) > max_unmapped_share:
        return UNMAPPED
    if (
        reads_lookalike_script(ocr_languages)
        and lookalike_share(text) > max_lookalike_share
        and hidden_text_share(drawing_log()) > HIDDEN_TEXT_SHARE
    ):
        return LOOKALIKE
    return None
