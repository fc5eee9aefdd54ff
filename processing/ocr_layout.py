"""Turn OCR text boxes into markdown paragraphs in reading order.

Pure geometry, no OCR library. Steps:
1. deskew: rotate all boxes by the median angle of their top edges, so a tilted scan
   gives horizontal lines whose bounding boxes do not overlap;
2. recursive XY-cut: split a region into side-by-side columns when a vertical gutter runs
   through all of it, otherwise cut it at its widest horizontal gap; leaves are lines;
3. paragraphs: lines follow each other unless there is a vertical gap, a jump back up
   (next column), a bullet, or a change of text size (heading).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

MAX_BOXES = 5000  # beyond this a page is noise; keep layout time bounded
COLUMN_GUTTER = 0.5  # in median line heights; OCR boxes are whole lines, so any clean gap is a gutter
PARAGRAPH_GAP = 0.7
HEADING_RATIO = 1.5
MIN_SKEW_DEGREES = 0.3
MAX_SKEW_DEGREES = 15.0

_BULLET = re.compile(r"^\s*(?:[•·●▪◦■□➢➤►‣⁃]|[-*–](?=\s))\s*")

Point = tuple[float, float]


@dataclass(frozen=True)
class OcrBox:
    """One recognised text snippet: its quadrilateral (tl, tr, br, bl) in pixels and text."""

    quad: tuple[Point, Point, Point, Point]
    text: str

    @classmethod
    def from_rect(cls, x0: float, y0: float, x1: float, y1: float, text: str) -> "OcrBox":
        return cls(((x0, y0), (x1, y0), (x1, y1), (x0, y1)), text)


@dataclass(frozen=True)
class _Item:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str

    @property
    def height(self) -> float:
        return self.y1 - self.y0

    @property
    def y_center(self) -> float:
        return (self.y0 + self.y1) / 2


@dataclass
class _Line:
    items: list[_Item]

    @property
    def x0(self) -> float:
        return min(item.x0 for item in self.items)

    @property
    def x1(self) -> float:
        return max(item.x1 for item in self.items)

    @property
    def y0(self) -> float:
        return min(item.y0 for item in self.items)

    @property
    def y1(self) -> float:
        return max(item.y1 for item in self.items)

    @property
    def height(self) -> float:
        return median(item.height for item in self.items)

    @property
    def text(self) -> str:
        return " ".join(item.text.strip() for item in self.items if item.text.strip())


def boxes_to_markdown(boxes: Iterable[OcrBox]) -> str:
    """Markdown paragraphs (blank-line separated) of the boxes in reading order."""
    kept = [box for box in boxes if box.text and box.text.strip()][:MAX_BOXES]
    if not kept:
        return ""
    items = _deskewed_items(kept)
    line_height = median(item.height for item in items) or 1.0
    lines = [line for region in _reading_order(items, line_height) for line in _region_lines(region, line_height)]
    return "\n\n".join(_paragraphs(lines, line_height)) + "\n"


# -- deskew -----------------------------------------------------------------
def _skew_angle(boxes: Sequence[OcrBox]) -> float:
    angles = []
    for box in boxes:
        (x_tl, y_tl), (x_tr, y_tr), _, (x_bl, y_bl) = box.quad
        width = math.hypot(x_tr - x_tl, y_tr - y_tl)
        height = math.hypot(x_bl - x_tl, y_bl - y_tl)
        if width >= 2 * max(height, 1.0):  # short boxes give noisy angles
            angles.append(math.atan2(y_tr - y_tl, x_tr - x_tl))
    if not angles:
        return 0.0
    angle = median(angles)
    degrees = abs(math.degrees(angle))
    return angle if MIN_SKEW_DEGREES <= degrees <= MAX_SKEW_DEGREES else 0.0


def _deskewed_items(boxes: Sequence[OcrBox]) -> list[_Item]:
    angle = _skew_angle(boxes)
    cos_a, sin_a = math.cos(-angle), math.sin(-angle)
    items = []
    for box in boxes:
        points = [(x * cos_a - y * sin_a, x * sin_a + y * cos_a) for x, y in box.quad] if angle else box.quad
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        items.append(_Item(min(xs), min(ys), max(xs), max(ys), box.text))
    return items


# -- XY-cut -----------------------------------------------------------------
def _reading_order(items: list[_Item], line_height: float) -> list[list[_Item]]:
    """Leaf regions (one line each, normally) in reading order."""
    leaves: list[list[_Item]] = []
    stack = [items]
    while stack:
        region = stack.pop()
        parts = _column_split(region, line_height) or _row_split(region)
        if parts is None:
            leaves.append(region)
        else:
            stack.extend(reversed(parts))  # the first part is read first
    return leaves


def _column_split(region: list[_Item], line_height: float) -> list[list[_Item]] | None:
    if len(region) < 2:
        return None
    ordered = sorted(region, key=lambda item: item.x0)
    parts, current, right_edge = [], [ordered[0]], ordered[0].x1
    for item in ordered[1:]:
        if item.x0 - right_edge >= COLUMN_GUTTER * line_height:
            parts.append(current)
            current = []
        current.append(item)
        right_edge = max(right_edge, item.x1)
    parts.append(current)
    if len(parts) < 2 or not all(_side_by_side(a, b) for a, b in zip(parts, parts[1:])):
        return None
    return parts


def _side_by_side(left: list[_Item], right: list[_Item]) -> bool:
    """Columns share vertical space; a right-aligned line above a left one does not."""
    top_l, bottom_l = min(i.y0 for i in left), max(i.y1 for i in left)
    top_r, bottom_r = min(i.y0 for i in right), max(i.y1 for i in right)
    overlap = min(bottom_l, bottom_r) - max(top_l, top_r)
    return overlap > 0 and overlap >= 0.5 * min(bottom_l - top_l, bottom_r - top_r)


def _row_split(region: list[_Item]) -> list[list[_Item]] | None:
    if len(region) < 2:
        return None
    ordered = sorted(region, key=lambda item: item.y0)
    best_gap, best_index, bottom = 0.0, None, ordered[0].y1
    for index, item in enumerate(ordered[1:], start=1):
        gap = item.y0 - bottom
        if gap > best_gap:
            best_gap, best_index = gap, index
        bottom = max(bottom, item.y1)
    if best_index is None:
        return None
    return [ordered[:best_index], ordered[best_index:]]


def _region_lines(region: list[_Item], line_height: float) -> list[_Line]:
    """Items of a leaf grouped into lines (several when skew left them overlapping)."""
    lines: list[_Line] = []
    for item in sorted(region, key=lambda i: i.y_center):
        if lines and abs(item.y_center - _line_center(lines[-1])) < 0.5 * line_height:
            lines[-1].items.append(item)
        else:
            lines.append(_Line([item]))
    for line in lines:
        line.items.sort(key=lambda i: i.x0)
    return lines


def _line_center(line: _Line) -> float:
    return sum(item.y_center for item in line.items) / len(line.items)


# -- paragraphs -------------------------------------------------------------
def _paragraphs(lines: list[_Line], line_height: float) -> list[str]:
    groups: list[list[_Line]] = []
    for line in lines:
        if not line.text:
            continue
        if groups and not _starts_paragraph(groups[-1][-1], line, line_height):
            groups[-1].append(line)
        else:
            groups.append([line])
    return [_render(group, line_height) for group in groups]


def _starts_paragraph(previous: _Line, line: _Line, line_height: float) -> bool:
    if line.y0 < previous.y0 - 0.5 * line_height:  # moved up: next column or region
        return True
    if line.y0 - previous.y1 > PARAGRAPH_GAP * line_height:
        return True
    if _BULLET.match(line.text):
        return True
    if line.x1 < previous.x0 or line.x0 > previous.x1:  # no horizontal overlap
        return True
    ratio = max(line.height, previous.height) / max(min(line.height, previous.height), 1e-6)
    if ratio >= 1.3:
        return True
    return _looks_like_heading(previous, line)


def _looks_like_heading(previous: _Line, line: _Line) -> bool:
    """The line before ends a paragraph, or is a short title over a capitalised full line."""
    text = previous.text.rstrip()
    width, previous_width = line.x1 - line.x0, previous.x1 - previous.x0
    if previous_width < 0.75 * width and text.endswith(_SENTENCE_END):
        return True  # the short last line of a paragraph
    short = previous_width < 0.6 * width
    return short and not text.endswith(_CLOSING) and line.text[:1].isupper() and len(text.split()) <= 8


_SENTENCE_END = (".", "!", "?", ":", '."', ".”", "!”")

_CLOSING = (".", ",", ";", ":", "!", "?", ")", '"', "'", "-", "—", "–", "”", "’")


def _render(group: list[_Line], line_height: float) -> str:
    text = ""
    for line in group:
        piece = line.text
        if not text:
            text = piece
        elif text.endswith("-") and len(text) > 1 and text[-2].isalpha():
            text += piece  # keep the hyphen: "multi-" + "track", never guess a dehyphenation
        else:
            text += " " + piece
    bullet = _BULLET.match(text)
    if bullet:
        return "- " + text[bullet.end() :]
    heights = [line.height for line in group]
    if len(group) <= 2 and len(text) <= 120 and median(heights) >= HEADING_RATIO * line_height:
        return "## " + text
    return text


def render_zoom(width_pt: float, height_pt: float, dpi: int, max_pixels: int) -> float:
    """Zoom for rendering a page at `dpi`, reduced so width*height stays within `max_pixels`.

    A poster is never refused for its size; it is just rendered coarser.
    """
    zoom = dpi / 72.0
    pixels = (width_pt * zoom) * (height_pt * zoom)
    if pixels > max_pixels > 0:
        zoom *= math.sqrt(max_pixels / pixels)
    return zoom


# -- Tesseract --------------------------------------------------------------
def tesseract_markdown(tsv: str) -> str:
    """Markdown paragraphs of Tesseract's TSV output (`tesseract … tsv`): its own paragraphs in its own reading
    order (its layout analysis finds columns and blocks itself), each paragraph's lines joined as `_render` joins
    RapidOCR's (a hyphen at a line's end is kept, never guessed away)."""
    paragraphs: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for row in tsv.splitlines()[1:]:
        fields = row.split("\t")
        if len(fields) < 12 or fields[0] != "5":  # level 5: a word; columns page, block, paragraph, line, ...
            continue
        word = fields[11].strip()
        if word:
            paragraphs.setdefault((fields[1], fields[2], fields[3]), {}).setdefault(fields[4], []).append(word)
    texts = []
    for lines in paragraphs.values():
        text = ""
        for piece in (" ".join(words) for words in lines.values()):
            if text.endswith("-") and len(text) > 1 and text[-2].isalpha():
                text += piece
            else:
                text = f"{text} {piece}" if text else piece
        texts.append(text)
    return "\n\n".join(texts) + "\n" if texts else ""
