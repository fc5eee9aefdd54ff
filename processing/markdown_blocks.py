"""One page's markdown as a sequence of blocks (headings, paragraphs, lists, tables, code) for the chunker
(pure Python, no Dagster).

ATX headings, fenced code, pipe tables and bullet or numbered lists are recognised; any other run of lines, up to
a blank line or the start of one of those, is a paragraph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(\S.*?)[ \t]*$")
_HEADING_CLOSING = re.compile(r"[ \t]+#+$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_EMPHASIS = "*_ \t"


@dataclass(frozen=True)
class Block:
    kind: str  # heading | paragraph | list | table | code
    lines: tuple[str, ...]
    level: int = 0


def _is_table_row(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) > 1 and stripped.startswith("|")


def _starts_block(line: str) -> bool:
    return bool(_HEADING.match(line) or _FENCE.match(line) or _is_table_row(line) or _LIST_ITEM.match(line))


def _read_fence(lines: list[str], start: int) -> int:
    """Index just past the closing fence (or the end when the fence is never closed)."""
    fence = _FENCE.match(lines[start])
    assert fence is not None, "called on a fence's opening line"
    opener = fence.group(1)
    closing = re.compile(r"^ {0,3}" + re.escape(opener[0]) + "{" + str(len(opener)) + r",}\s*$")
    end = start + 1
    while end < len(lines):
        if closing.match(lines[end]):
            return end + 1
        end += 1
    return end


def _read_list(lines: list[str], start: int) -> int:
    """Index just past a list: items, their continuation lines and blank lines inside the list."""
    end = start + 1
    while end < len(lines):
        line = lines[end]
        if not line.strip():
            following = end + 1
            if (
                following < len(lines)
                and (_LIST_ITEM.match(lines[following]) or lines[following][:1] in " \t")
                and lines[following].strip()
            ):
                end += 1
                continue
            return end
        if _HEADING.match(line) or _FENCE.match(line) or _is_table_row(line):
            return end
        end += 1
    return end


def _read_while(lines: list[str], start: int, keep) -> int:
    end = start + 1
    while end < len(lines) and keep(lines[end]):
        end += 1
    return end


def parse_blocks(markdown: str) -> Iterator[Block]:
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
            continue
        heading = _HEADING.match(line)
        if _FENCE.match(line):
            end, kind = _read_fence(lines, index), "code"
        elif heading:
            yield Block("heading", (line.strip(),), level=len(heading.group(1)))
            index += 1
            continue
        elif _is_table_row(line):
            end, kind = _read_while(lines, index, _is_table_row), "table"
        elif _LIST_ITEM.match(line):
            end, kind = _read_list(lines, index), "list"
        else:
            end = _read_while(lines, index, lambda next_line: bool(next_line.strip()) and not _starts_block(next_line))
            kind = "paragraph"
        block_lines = tuple(text.rstrip() for text in lines[index:end])
        if kind != "code":
            block_lines = tuple(text for text in block_lines if text.strip())
        yield Block(kind, block_lines)
        index = end


def heading_title(line: str) -> str:
    match = _HEADING.match(line)
    if not match:
        return line.strip()
    title = _HEADING_CLOSING.sub("", match.group(2))
    return " ".join(title.strip(_EMPHASIS).split())


def list_items(lines: Sequence[str]) -> list[str]:
    """A list block's items, each with its continuation lines joined onto it."""
    items: list[list[str]] = []
    for line in lines:
        if _LIST_ITEM.match(line) or not items:
            items.append([line.rstrip()])
        else:
            items[-1].append(line.strip())
    return [" ".join(parts) for parts in items]
