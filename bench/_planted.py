"""Planted near-duplicates for bench/retrieval.py: copies of input PDFs written into a scratch folder, the family
each document belongs to, and how well the pipeline's content groups match those families.

Not a bench of its own (tests/acceptance/test_bench_smoke.py leaves out the modules whose names start with an
underscore). Per chosen PDF with a text layer, two copies:

  version  each page's text extracted with PyMuPDF, one word of it changed, written as a new text-layer PDF; a
           page whose layer docqueue does not trust (processing/layer_trust.py, the PDF worker's own rule: a layer
           its fonts could not map, an earlier OCR's Latin look-alikes of a Cyrillic print) is written from what
           docqueue reads there instead (the PDF worker, with this process's OCR settings), so the version is a
           version of the document's content, not of a layer docqueue replaces
  rescan   each page rendered at another DPI, turned by a small angle, saved as an image-only PDF (read by OCR)

Beside them, with --plant-boilerplate N, N documents that are no copies of anything: each holds the same notice
page (NOTICE, word for word) and a page of prose of its own (words of the inputs' text layers in a seeded random
order, cut into sentences), as a firm's documents carry one cover notice. Two of them share about half of their
text; grouping them is wrong, so they measure precision against shared boilerplate.

A copy's file name says which original it copies (`planted-version__NAME.pdf`), so the families are read back from
the documents' file names, also from a kept home evaluated again with --no-process; a notice document
(`planted-notice__N.pdf`) is a family of its own. Inputs that are near-copies of
each other already (../shared/corpus holds one such pair: the same Lorem ipsum paragraph set by LibreOffice and by
pdfTeX) are one family too: `input_families` finds them by the exact Jaccard similarity of their text layers' word
shingles (PyMuPDF's text, not the pipeline's), so grouping them is not counted against the pipeline.
"""

from __future__ import annotations

import html
import itertools
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pymupdf
from PIL import Image

from processing.layer_trust import distrust_reason
from processing.page_cleanup import meaningful_chars, unmapped_share
from queue_db.config import StorageConfig, default
from resources.ocr import PdfProcessor
from resources.pdf_limits import PdfLimits

PREFIXES = ("planted-version__", "planted-rescan__")
NOTICE_PREFIX = "planted-notice__"
# the shared page of the notice documents: a cover notice as many documents of one sender carry it
NOTICE = (
    "Confidentiality notice. This document and any attachment are intended solely for the addressee named on the "
    "covering letter and may contain information that is privileged, confidential or otherwise protected from "
    "disclosure under applicable law. If you are not the intended recipient, you are hereby notified that any "
    "review, dissemination, distribution, copying or other use of this document or its contents is strictly "
    "prohibited. If you received it in error, please notify the sender immediately by return message and destroy "
    "every copy in your possession, whether printed or stored electronically. The sender accepts no liability for "
    "any damage caused by viruses transmitted with this document, and recipients should carry out their own checks "
    "before opening any attachment. Opinions expressed in this document are those of the author and do not "
    "necessarily represent the views of the organisation. Records of correspondence may be retained and monitored "
    "in accordance with the organisation's retention policy and with the data protection regulations in force in "
    "the jurisdiction where the document was issued. Nothing in this document creates a binding commitment unless "
    "confirmed in writing by an authorised signatory of the organisation."
)
NOTICE_BODY_WORDS = (80, 160)  # a notice document's own page: the notice is about half of what two hold
RESCAN_DPI = 150
RESCAN_ANGLE = 1.2  # degrees: the skew of a sheet laid slightly askew on a scanner
MIN_TEXT_CHARS = 200  # a text layer with less than this is a stray label, not a page of prose to copy
MAX_UNMAPPED_SHARE = default(StorageConfig, "max_unmapped_share")
_CHANGEABLE = re.compile(r"\b[^\W\d_]{5,}\b")


def has_text_layer(path: Path) -> bool:
    """Whether PyMuPDF opens the file and finds enough readable text in its pages (broken or encrypted files are
    not; nor is a layer its fonts could not map, which docqueue OCRs: a version written from it would be junk)."""
    try:
        with pymupdf.open(path) as doc:
            if doc.needs_pass or doc.page_count == 0:
                return False
            text = "".join(page.get_text() for page in doc)
            return meaningful_chars(text) >= MIN_TEXT_CHARS and unmapped_share(text) <= MAX_UNMAPPED_SHARE
    except Exception:  # noqa: BLE001 - any file PyMuPDF cannot read is no original to copy
        return False


def _one_word_changed(text: str, rng: random.Random) -> str:
    words = list(_CHANGEABLE.finditer(text))
    if not words:
        return text
    word = rng.choice(words)
    return text[: word.start()] + word.group()[::-1].lower() + text[word.end() :]


def _write_text(page: pymupdf.Page, text: str) -> None:
    """The text in the page's box as HTML, shrunk until it fits (a longer page gets smaller print rather than
    losing its end); HTML because the Story behind it falls back to fonts with any character, where the base-14
    fonts print `?` for what is not Latin-1."""
    body = "<br>".join(html.escape(line) for line in text.splitlines())
    page.insert_htmlbox(page.rect + (36, 36, -36, -36), f"<p style='font-size:10pt'>{body}</p>", scale_low=0)


class DocqueueReading:
    """A page's text as docqueue reads it: its text layer, or, where docqueue does not trust the layer
    (`distrust_reason`, with `limits`' thresholds and OCR languages), the PDF worker's reading of the page. The
    worker starts at the first such page; `distrusted_pages` counts them."""

    def __init__(self, limits: PdfLimits):
        self.limits = limits
        self.distrusted_pages = 0
        self._processor: PdfProcessor | None = None

    def text(self, source: Path, page: pymupdf.Page) -> str:
        layer = page.get_text()
        reason = distrust_reason(
            layer,
            page.get_bboxlog,
            max_unmapped_share=self.limits.max_unmapped_share,
            max_lookalike_share=self.limits.max_lookalike_share,
            ocr_languages=self.limits.ocr_languages,
        )
        if reason is None:
            return layer
        if self._processor is None:
            self._processor = PdfProcessor(self.limits)
        self.distrusted_pages += 1
        return self._processor.convert_page(source, page.number + 1).markdown

    def close(self) -> None:
        if self._processor is not None:
            self._processor.close()
            self._processor = None


def write_version(source: Path, folder: Path, rng: random.Random, reading: DocqueueReading | None = None) -> Path:
    """Each page's text (`reading`'s, else its text layer) with one word changed, as a new text-layer PDF."""
    target = folder / f"{PREFIXES[0]}{source.name}"
    with pymupdf.open(source) as original, pymupdf.open() as copy:
        for page in original:
            new = copy.new_page(width=page.rect.width, height=page.rect.height)
            text = reading.text(source, page) if reading is not None else page.get_text()
            _write_text(new, _one_word_changed(text, rng))
        copy.save(target, garbage=1)
    return target


def write_rescan(source: Path, folder: Path) -> Path:
    target = folder / f"{PREFIXES[1]}{source.name}"
    with pymupdf.open(source) as original, pymupdf.open() as copy:
        for page in original:
            pixmap = page.get_pixmap(dpi=RESCAN_DPI, colorspace=pymupdf.csGRAY)
            image = Image.frombytes("L", (pixmap.width, pixmap.height), pixmap.samples)
            turned = image.rotate(RESCAN_ANGLE, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255)
            path = folder / f".{target.stem}-{page.number}.png"
            turned.save(path)
            new = copy.new_page(width=page.rect.width, height=page.rect.height)
            new.insert_image(new.rect, filename=str(path), keep_proportion=True)
            path.unlink()
        copy.save(target, garbage=1)
    return target


def _vocabulary(files: list[Path]) -> list[str]:
    """The distinct words of four letters or more in the files' text layers, in order of first occurrence."""
    words: dict[str, None] = {}
    for path in files:
        try:
            with pymupdf.open(path) as doc:
                if doc.needs_pass:
                    continue
                text = "".join(page.get_text() for page in doc)
        except Exception:  # noqa: BLE001 - a file PyMuPDF cannot read gives no words
            continue
        words.update((w.lower(), None) for w in re.findall(r"\b[^\W\d_]{4,}\b", text))
    return list(words) or ["lorem", "ipsum", "dolor", "amet"]


def _prose(rng: random.Random, vocabulary: list[str], words: int) -> str:
    """`words` words drawn from `vocabulary`, cut into sentences of 8 to 16 words."""
    sentences, left = [], words
    while left > 0:
        length = min(left, rng.randint(8, 16))
        drawn = rng.choices(vocabulary, k=length)
        sentences.append(" ".join([drawn[0].capitalize(), *drawn[1:]]) + ".")
        left -= length
    return " ".join(sentences)


def write_notices(files: list[Path], count: int, folder: Path, rng: random.Random) -> list[Path]:
    """`count` documents of two pages: NOTICE, then prose of their own (`_prose` over the files' words)."""
    vocabulary = _vocabulary(files)
    written = []
    for number in range(1, count + 1):
        target = folder / f"{NOTICE_PREFIX}{number}.pdf"
        with pymupdf.open() as doc:
            for text in (NOTICE, _prose(rng, vocabulary, rng.randint(*NOTICE_BODY_WORDS))):
                _write_text(doc.new_page(), text)
            doc.save(target, garbage=1)
        written.append(target)
    return written


def plant(
    files: list[Path], count: int, folder: Path, seed: int, notices: int = 0, limits: PdfLimits | None = None
) -> list[Path]:
    """A version and a re-scan of each of the first `count` files with a text layer, and `notices` notice
    documents (`write_notices`), written into `folder`. `limits` (default PdfLimits()) are the reading settings of
    the pipeline the copies are for: the versions are written from what it reads (`DocqueueReading`)."""
    rng = random.Random(seed)
    originals = [path for path in files if has_text_layer(path)][:count]
    reading = DocqueueReading(limits or PdfLimits())
    try:
        copies = [
            copy
            for source in originals
            for copy in (write_version(source, folder, rng, reading), write_rescan(source, folder))
        ]
    finally:
        reading.close()
    if reading.distrusted_pages:
        print(f"planted versions: {reading.distrusted_pages} page(s) written from docqueue's reading", file=sys.stderr)
    return copies + write_notices(files, notices, folder, rng)


def family(filename: str) -> str:
    """The original a document copies (its own file name for an original)."""
    name = Path(filename).name
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


# exact Jaccard similarity of two inputs' text-layer shingles from which they are one family: on ../shared/corpus
# the one such pair measures 0.889 and every other pair of inputs below 0.02
INPUT_COPY_JACCARD = 0.5
INPUT_SHINGLE_WORDS = 4


def _shingles(path: Path) -> set[str]:
    try:
        with pymupdf.open(path) as doc:
            if doc.needs_pass:
                return set()
            words = re.findall(r"\w+", "".join(page.get_text() for page in doc).lower())
    except Exception:  # noqa: BLE001 - a file PyMuPDF cannot read is nobody's copy
        return set()
    width = INPUT_SHINGLE_WORDS
    return {" ".join(words[i : i + width]) for i in range(len(words) - width + 1)}


def input_families(files: list[Path]) -> dict[str, str]:
    """Per file name of `files` that is a near-copy of another of them (exact Jaccard similarity of their
    text layers' word shingles >= INPUT_COPY_JACCARD), the name of the family it belongs to (the first of its
    members by name); files that copy none are left out."""
    shingles = {path.name: _shingles(path) for path in sorted(files, key=lambda p: p.name)}
    parent = {name: name for name in shingles}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for a, b in itertools.combinations(shingles, 2):
        first, second = shingles[a], shingles[b]
        if first and second and len(first & second) >= INPUT_COPY_JACCARD * len(first | second):
            parent[max(root(a), root(b))] = min(root(a), root(b))
    grouped = Counter(root(name) for name in shingles)
    return {name: root(name) for name in shingles if grouped[root(name)] > 1}


def _pairs(groups: dict[str, set[str]]) -> set[frozenset[str]]:
    return {frozenset(pair) for members in groups.values() for pair in itertools.combinations(sorted(members), 2)}


def group_scores(documents: list[tuple[str, str, str | None]], inputs: dict[str, str] | None = None) -> dict:
    """Pair precision and recall of the content groups against the planted families, over the documents given as
    (document_key, filename, content group id or None); `inputs` (`input_families`) joins the families of inputs
    that are near-copies of each other. A pair is two documents of one group (predicted) or of one family
    (planted); None when there is no pair to count."""
    inputs = inputs or {}
    planted: dict[str, set[str]] = defaultdict(set)
    grouped: dict[str, set[str]] = defaultdict(set)
    for key, filename, group in documents:
        original = family(filename)
        planted[inputs.get(original, original)].add(key)
        if group is not None:
            grouped[group].add(key)
    truth, found = _pairs(planted), _pairs(grouped)
    right = len(truth & found)
    return {
        "planted_pairs": len(truth),
        "grouped_pairs": len(found),
        "group_precision": round(right / len(found), 4) if found else None,
        "group_recall": round(right / len(truth), 4) if truth else None,
        "planted_copies": sum(len(members) - 1 for members in planted.values() if len(members) > 1),
        "groups": len(grouped),
        "input_copies": sorted(inputs),
    }
