"""Plain text, Markdown and HTML as page markdown, without OCR.

A text document has no pages of its own: it is split at paragraph boundaries into pages of at most
`DOCQUEUE_TEXT_PAGE_CHARS` characters. The split is a pure function of the bytes and the limit, so expansion
(which counts the pages) and each page task (which writes one page) agree without storing anything in between.
HTML becomes markdown first (headings, lists, paragraphs, tables, links' text; scripts and styles dropped),
through the html-to-markdown library.
"""

from __future__ import annotations

import codecs
import functools
import re
from dataclasses import dataclass

from queue_db.config import StorageConfig, default

MB = 1024 * 1024
TEXT_TYPES = {"text/plain": "text", "text/markdown": "text", "text/html": "html"}  # mime -> page method
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


class TextTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class TextLimits:
    page_chars: int = default(StorageConfig, "text_page_chars")
    max_bytes: int = int(default(StorageConfig, "max_text_mb") * MB)

    def __post_init__(self):
        if self.page_chars < 200:
            raise ValueError(f"DOCQUEUE_TEXT_PAGE_CHARS must be at least 200, got {self.page_chars}")
        if self.max_bytes <= 0:
            raise ValueError("DOCQUEUE_MAX_TEXT_MB must be greater than 0")

    @classmethod
    def from_config(cls, storage: StorageConfig) -> "TextLimits":
        return cls(page_chars=storage.text_page_chars, max_bytes=int(storage.max_text_mb * MB))


# ------------------------------------------------------------------------------------------------ decoding
def decode_text(data: bytes, *, html: bool = False) -> str:
    """A byte-order mark decides; then an HTML meta charset; then UTF-8; then Windows-1252 (never fails)."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return _normalise_newlines(data.decode(codec, errors="replace"))
    if html:
        declared = _META_CHARSET.search(data[:4096])
        if declared:
            try:
                return _normalise_newlines(
                    data.decode(codecs.lookup(declared.group(1).decode("ascii")).name, errors="replace")
                )
            except LookupError:
                pass
    try:
        return _normalise_newlines(data.decode("utf-8"))
    except UnicodeDecodeError:
        return _normalise_newlines(data.decode("cp1252", errors="replace"))


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


# ------------------------------------------------------------------------------------------------ pages
def split_pages(text: str, page_chars: int) -> list[str]:
    """Paragraphs (blank-line separated) packed into pages of at most `page_chars` characters, joined by one
    blank line. A paragraph longer than a page is cut at line ends, then at spaces, then anywhere."""
    pages: list[str] = []
    current: list[str] = []
    size = 0
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        for piece in _pieces(paragraph, page_chars):
            added = len(piece) + (2 if current else 0)
            if current and size + added > page_chars:
                pages.append("\n\n".join(current))
                current, size, added = [], 0, len(piece)
            current.append(piece)
            size += added
    if current:
        pages.append("\n\n".join(current))
    return pages


def _pieces(paragraph: str, limit: int) -> list[str]:
    if len(paragraph) <= limit:
        return [paragraph]
    pieces: list[str] = []
    rest = paragraph
    while len(rest) > limit:
        window = rest[: limit + 1]
        cut = window.rfind("\n")
        if cut <= 0:
            cut = window.rfind(" ")
        if cut <= 0:
            cut = limit
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip("\n ")
    if rest.strip():
        pieces.append(rest)
    return [p for p in pieces if p.strip()]


def document_pages(data: bytes, mime: str, limits: TextLimits) -> list[str]:
    """The page markdown of a text document, in order."""
    if len(data) > limits.max_bytes:
        raise TextTooLarge(
            f"too large: text of {len(data) / MB:.1f} MB > limit {limits.max_bytes / MB:g} MB (DOCQUEUE_MAX_TEXT_MB)"
        )
    if mime == "text/html":
        text = html_to_markdown(decode_text(data, html=True))
    else:
        text = decode_text(data)
    return split_pages(text, limits.page_chars)


# ------------------------------------------------------------------------------------------------ HTML
class UnreadableMarkup(ValueError):
    """HTML that cannot become markdown without losing part of its text."""


# inline markup carries no meaning for search: its text stays, its markers go
_INLINE_STRIPPED = ["a", "abbr", "b", "em", "font", "i", "mark", "s", "small", "span", "strong", "u"]
_TRAILING_SPACES = re.compile(r"[ \t]+\n")
# what the converter reports when it left text out
_LOSSY_WARNINGS = {"depth_limit_exceeded", "truncated_input"}


@functools.cache
def _html_options():
    """The converter's options, built once, on the first HTML converted (the converter is imported then)."""
    import html_to_markdown as html_to_markdown_lib

    return html_to_markdown_lib.ConversionOptions(
        extract_metadata=False,
        bullets="-",
        strip_tags=_INLINE_STRIPPED,
        autolinks=False,
        skip_images=True,
        escape_misc=False,
        newline_style="spaces",
    )


def html_to_markdown(html: str) -> str:
    """Headings, paragraphs, lists, tables, quotes and code as markdown; scripts, styles and the head dropped."""
    # imported here, when HTML is converted: intake (`docqueue ingest`) loads this module to know the text types
    # and needs no converter, a twentieth of a second of its start-up
    import html_to_markdown as html_to_markdown_lib

    result = html_to_markdown_lib.convert(html, _html_options())
    lost = [warning.message for warning in result.warnings if str(warning.kind) in _LOSSY_WARNINGS]
    if lost:
        raise UnreadableMarkup(
            f"HTML that cannot be read whole, nested more than 1,023 elements deep or too long ({lost[0].rstrip('.')})"
        )
    # the stub allows None; a markdown conversion always gives text (empty for empty or script-only input)
    assert result.content is not None, "html_to_markdown returned no markdown"
    return _TRAILING_SPACES.sub("\n", result.content).strip()
