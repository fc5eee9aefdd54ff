"""Plain text, Markdown and HTML as page markdown, without OCR.

A text document has no pages of its own: it is split at paragraph boundaries into pages of at most
`DOCQUEUE_TEXT_PAGE_CHARS` characters. The split is a pure function of the bytes and the limit, so expansion
(which counts the pages) and each page task (which writes one page) agree without storing anything in between.
HTML becomes markdown first (headings, lists, paragraphs, tables, links' text; scripts and styles dropped),
with the standard library's parser.
"""
from __future__ import annotations

import codecs
import os
import re
from dataclasses import dataclass
from html.parser import HTMLParser

MB = 1024 * 1024
TEXT_TYPES = {"text/plain": "text", "text/markdown": "text", "text/html": "html"}  # mime -> page method
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


class TextTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class TextLimits:
    page_chars: int = 20_000
    max_bytes: int = 20 * MB

    def __post_init__(self):
        if self.page_chars < 200:
            raise ValueError(f"DOCQUEUE_TEXT_PAGE_CHARS must be at least 200, got {self.page_chars}")
        if self.max_bytes <= 0:
            raise ValueError("DOCQUEUE_MAX_TEXT_MB must be greater than 0")

    @classmethod
    def from_env(cls) -> "TextLimits":
        return cls(page_chars=int(env_number("DOCQUEUE_TEXT_PAGE_CHARS", 20_000)),
                   max_bytes=int(env_number("DOCQUEUE_MAX_TEXT_MB", 20) * MB))


def env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


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
                return _normalise_newlines(data.decode(codecs.lookup(declared.group(1).decode("ascii")).name,
                                                       errors="replace"))
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
        window = rest[:limit + 1]
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
        raise TextTooLarge(f"too large: text of {len(data) / MB:.1f} MB > limit {limits.max_bytes / MB:g} MB "
                           "(DOCQUEUE_MAX_TEXT_MB)")
    if mime == "text/html":
        text = html_to_markdown(decode_text(data, html=True))
    else:
        text = decode_text(data)
    return split_pages(text, limits.page_chars)


# ------------------------------------------------------------------------------------------------ HTML
def html_to_markdown(html: str) -> str:
    writer = _MarkdownWriter()
    writer.feed(html)
    writer.close()
    return writer.markdown()


_SKIPPED = frozenset({"script", "style", "head", "template", "noscript", "svg", "math", "iframe", "object",
                      "select", "button"})
_BLOCKS = frozenset({"p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "figure",
                     "figcaption", "address", "form", "fieldset", "dl", "dt", "dd", "hr", "body", "center",
                     "details", "summary", "caption"})
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_LINE_BREAK = "\x00"  # a <br> inside running text, kept apart from whitespace that collapses


class _MarkdownWriter(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.group: list[str] | None = None  # lines that stay together: a list, a table
        self.inline: list[str] = []
        self.skipping: list[str] = []
        self.heading = 0
        self.quote = 0
        self.lists: list[list] = []  # [kind, next number] per open list
        self.item_started = False  # the current <li>'s first line carries the marker
        self.table: list[list[str]] | None = None
        self.row: list[str] | None = None
        self.cell: list[str] | None = None
        self.pre: list[str] | None = None

    # -- parser events ------------------------------------------------------------------------
    def handle_starttag(self, tag, attrs):
        if self.skipping:
            if tag == "body" and self.skipping == ["head"]:
                self.skipping.clear()  # an unclosed <head> ends where the body starts
            elif tag in _SKIPPED:
                self.skipping.append(tag)
            return
        if tag in _SKIPPED:
            self.skipping.append(tag)
            return
        if self.pre is not None:
            if tag == "br":
                self.pre.append("\n")
            return
        if tag == "br":
            self._text_buffer().append(_LINE_BREAK)
        elif tag == "pre":
            self._flush()
            self.pre = []
        elif tag in _HEADINGS:
            self._flush()
            self.heading = _HEADINGS[tag]
        elif tag in ("ul", "ol"):
            self._flush()
            self.lists.append([tag, 1])
        elif tag == "li":
            self._flush()
            self.item_started = False
        elif tag == "blockquote":
            self._flush()
            self.quote += 1
        elif tag == "table":
            self._flush()
            if self.table is None:
                self.table = []
        elif tag == "tr" and self.table is not None:
            self._end_row()
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self._end_cell()
            self.cell = []
        elif tag in _BLOCKS:
            self._flush()

    def handle_startendtag(self, tag, attrs):
        if tag in _SKIPPED:
            return  # a self-closed <svg/> or <script/> has no content to skip
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if self.skipping:
            if tag in self.skipping:
                while self.skipping and self.skipping.pop() != tag:
                    pass
            return
        if self.pre is not None:
            if tag == "pre":
                code = "".join(self.pre).strip("\n")
                self.pre = None
                if code.strip():
                    self._paragraph(f"```\n{code}\n```")
            return
        if tag in _HEADINGS:
            self._flush()
            self.heading = 0
        elif tag in ("ul", "ol"):
            self._flush()
            if self.lists:
                self.lists.pop()
            if not self.lists:
                self._end_group()
        elif tag == "li":
            self._flush()
        elif tag == "blockquote":
            self._flush()
            self.quote = max(0, self.quote - 1)
        elif tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr":
            self._end_row()
        elif tag == "table" and self.table is not None:
            self._end_table()
        elif tag in _BLOCKS:
            self._flush()

    def handle_data(self, data):
        if self.skipping:
            return
        if self.pre is not None:
            self.pre.append(data)
        else:
            self._text_buffer().append(data)

    def close(self):
        super().close()
        self.skipping.clear()
        if self.pre is not None:
            self.handle_endtag("pre")
        self._end_table()
        self._flush()
        self.lists.clear()
        self._end_group()

    def markdown(self) -> str:
        return "\n\n".join(self.paragraphs)

    # -- output -------------------------------------------------------------------------------
    def _text_buffer(self) -> list[str]:
        return self.cell if self.cell is not None else self.inline

    def _flush(self) -> None:
        """The running text becomes a heading, a list item, a quote or a paragraph."""
        lines = _collapse(self.inline)
        self.inline = []
        if not lines:
            return
        if self.heading:
            self._paragraph("#" * self.heading + " " + " ".join(lines))
        elif self.lists:
            depth = "  " * (len(self.lists) - 1)
            kind = self.lists[-1]
            for line in lines:
                if not self.item_started:
                    marker = "- " if kind[0] == "ul" else f"{kind[1]}. "
                    if kind[0] == "ol":
                        kind[1] += 1
                    self.item_started = True
                    self._line(depth + marker + line)
                else:
                    self._line(depth + "  " + line)
        elif self.quote:
            self._paragraph("\n".join("> " + line for line in lines))
        else:
            self._paragraph("\n".join(lines))

    def _paragraph(self, text: str) -> None:
        self._end_group()
        self.paragraphs.append(text)

    def _line(self, text: str) -> None:
        if self.group is None:
            self.group = []
        self.group.append(text)

    def _end_group(self) -> None:
        if self.group:
            self.paragraphs.append("\n".join(self.group))
        self.group = None

    def _end_cell(self) -> None:
        if self.cell is not None and self.row is not None:
            self.row.append(" ".join(_collapse(self.cell)).replace("|", "\\|"))
        self.cell = None

    def _end_row(self) -> None:
        self._end_cell()
        if self.row and self.table is not None and any(self.row):
            self.table.append(self.row)
        self.row = None

    def _end_table(self) -> None:
        self._end_row()
        rows, self.table = self.table, None
        if not rows:
            return
        self._flush()
        width = max(len(r) for r in rows)
        lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * width)
        self._paragraph("\n".join(lines))


def _collapse(parts: list[str]) -> list[str]:
    """Running text with whitespace collapsed the way a browser does; <br> kept as line ends."""
    lines = [" ".join(line.split()) for line in "".join(parts).split(_LINE_BREAK)]
    return [line for line in lines if line]
