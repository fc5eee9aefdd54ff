"""Header/footer ("boilerplate") detection and removal, and bare page-number removal.

Pure text logic, no PDF library: the worker feeds it the first and last lines of each
sampled page's text layer, and the markdown of one page to clean.

A boilerplate entry is a *normalised* line: lower-cased, markdown emphasis removed,
whitespace collapsed and every run of digits replaced by ``#`` -- so "Page 3 of 10"
and "Page 4 of 10" are the same entry ("page # of #").
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

EDGE_LINES = 3  # lines looked at on each end of a page when learning boilerplate
PEEL_LIMIT = 6  # most lines removed from each end of a page when cleaning
MAX_BOILERPLATE_LINE = 160  # longer lines are body text, never furniture
MIN_REPEAT_PAGES = 3
MIN_REPEAT_SHARE = 0.4  # running heads alternating between odd/even pages still count

_MARKDOWN_DECORATION = re.compile(r"(<[^>\n]{1,20}>|\*\*|__|[*_`~])")
_HEADING_MARK = re.compile(r"^\s{0,3}#{1,6}\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-+]\s+)")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}")
_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
_ROMAN = re.compile(r"^(?=[ivxlcdm]+$)m{0,3}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})$")
_PAGE_NUMBER = re.compile(
    r"""^(?:
        (?:page|p\.|pg\.?|seite|página|pagina)?\s*
        (?P<num>\d{1,5}|[ivxlcdm]{1,7})
        (?:\s*(?:of|/|von|de|sur)\s*\d{1,5})?
    )$""",
    re.VERBOSE,
)


def normalise_line(line: str) -> str:
    """The comparison form of a line; '' when nothing meaningful is left."""
    text = _HEADING_MARK.sub("", line)
    text = _MARKDOWN_DECORATION.sub("", text)
    text = text.replace("|", " ")
    text = _SPACES.sub(" ", text).strip().lower()
    return _DIGITS.sub("#", text)


def is_page_number_line(line: str) -> bool:
    """True for lines that are only a page number: '7', '- 7 -', 'Page 7', '7 / 20', 'xii'."""
    text = _MARKDOWN_DECORATION.sub("", _HEADING_MARK.sub("", line))
    text = _SPACES.sub(" ", text).strip().lower()
    text = text.strip("-–—·•() ").strip()
    if not text:
        return False
    match = _PAGE_NUMBER.match(text)
    if not match:
        return False
    number = match.group("num")
    return number.isdigit() or bool(_ROMAN.match(number))


MIN_LINES_TO_LEARN = 3  # header + body + footer; a one-line page's only line is its content


def edge_lines(page_text: str, count: int = EDGE_LINES) -> list[str]:
    """The first and last `count` non-empty lines of a page's text ([] for near-empty pages)."""
    lines = [line for line in page_text.splitlines() if line.strip()]
    if len(lines) < MIN_LINES_TO_LEARN:
        return []
    if len(lines) <= 2 * count:
        return lines
    return lines[:count] + lines[-count:]


def find_boilerplate(pages_edge_lines: Sequence[Iterable[str]]) -> list[str]:
    """Normalised lines that repeat at the top/bottom of many of the given pages.

    `pages_edge_lines` holds, for every sampled page, its first and last few lines.
    """
    pages_with_text = 0
    seen_on_pages: Counter[str] = Counter()
    for lines in pages_edge_lines:
        keys = {normalise_line(line) for line in lines}
        keys = {key for key in keys if _can_be_boilerplate(key)}
        if keys:
            pages_with_text += 1
        seen_on_pages.update(keys)
    if pages_with_text < MIN_REPEAT_PAGES:
        return []
    needed = max(MIN_REPEAT_PAGES, math.ceil(MIN_REPEAT_SHARE * pages_with_text))
    return sorted(key for key, pages in seen_on_pages.items() if pages >= needed)


def _can_be_boilerplate(key: str) -> bool:
    # a bare number repeats everywhere but is handled by the page-number rule,
    # which only ever removes it at the page edges
    return bool(key) and len(key) <= MAX_BOILERPLATE_LINE and key.strip("#- ") != ""


def strip_page_furniture(markdown: str, boilerplate: Iterable[str] = ()) -> str:
    """Remove repeated header/footer lines and bare page numbers from the ends of a page.

    Only the outermost lines are peeled (at most PEEL_LIMIT per end, stopping at the
    first line that is neither), so body text that happens to match stays.
    """
    known = {entry for entry in boilerplate if entry}
    lines = markdown.splitlines()

    def is_furniture(line: str) -> bool:
        return normalise_line(line) in known or is_page_number_line(line)

    start, removed = 0, 0
    while start < len(lines) and removed < PEEL_LIMIT:
        if not lines[start].strip():
            start += 1
            continue
        if not is_furniture(lines[start]):
            break
        start += 1
        removed += 1
    end, removed = len(lines), 0
    while end > start and removed < PEEL_LIMIT:
        if not lines[end - 1].strip():
            end -= 1
            continue
        if not is_furniture(lines[end - 1]):
            break
        end -= 1
        removed += 1
    return tidy_markdown("\n".join(lines[start:end]))


_MANY_BLANKS = re.compile(r"\n{3,}")


_LIGATURES = str.maketrans(
    {"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl", "\ufb05": "st", "\ufb06": "st"}
)


def tidy_markdown(markdown: str) -> str:
    """Ligatures spelled out ("ﬁ" -> "fi", so words match searches), trailing spaces off,
    at most one blank line in a row, one final newline."""
    text = "\n".join(line.rstrip() for line in markdown.translate(_LIGATURES).splitlines())
    text = _MANY_BLANKS.sub("\n\n", text).strip("\n")
    return text + "\n" if text else ""


_WORD = re.compile(r"[^\W_]+")  # '_' is markdown emphasis, never part of a word here
_LINE_END_HYPHEN = re.compile(r"(?<=\w)-\n(?=\w)")
MISSING_BLOCK_SHARE = 0.5  # a block counts as dropped when fewer than half its words made it


def comparable_words(text: str) -> list[str]:
    """Lower-case words, ligatures spelled out and line-end hyphenation joined."""
    return _WORD.findall(_LINE_END_HYPHEN.sub("", text.translate(_LIGATURES)).lower())


def recover_missing_blocks(markdown: str, block_texts: Iterable[str]) -> str:
    """Append text-layer blocks whose words the markdown converter dropped.

    pymupdf4llm skips rotated lines, text inside vector figures and invisible (OCR-layer)
    text; appending those blocks keeps every word searchable without losing the
    structure (headings, tables) of the rest of the page.
    """
    available = Counter(comparable_words(markdown))
    recovered = []
    for block in block_texts:
        block_words = comparable_words(block)
        if not block_words:
            continue
        # count with multiplicity, so a figure label repeating a word of the body
        # still counts as missing when the converter dropped it
        needed = Counter(block_words)
        kept = sum(min(count, available[word]) for word, count in needed.items())
        if kept < MISSING_BLOCK_SHARE * len(block_words):
            recovered.append(" ".join(_LINE_END_HYPHEN.sub("", block).split()))
        else:
            available.subtract(needed)
    if not recovered:
        return markdown
    return markdown.rstrip("\n") + ("\n\n" if markdown.strip() else "") + "\n\n".join(recovered) + "\n"


def _unmapped(ch: str) -> bool:
    """A character a font without a unicode map leaves in a text layer: U+FFFD, or its glyph id read as a control
    code (U+0001-U+001F and friends)."""
    return ch == "\ufffd" or (not ch.isspace() and unicodedata.category(ch) in ("Cc", "Co", "Cs"))


def meaningful_chars(text: str) -> int:
    """Characters that carry content: no whitespace, none a font without a unicode map left (U+FFFD, control
    codes)."""
    return sum(1 for ch in text if not ch.isspace() and not _unmapped(ch))


def unmapped_share(text: str) -> float:
    """The share of a text layer's non-space characters its fonts could not map to unicode (0 for no text). A
    layer mostly unmapped reads as scattered letters among codes: the page is better read by OCR."""
    printed = [ch for ch in text if not ch.isspace()]
    return sum(1 for ch in printed if _unmapped(ch)) / len(printed) if printed else 0.0
