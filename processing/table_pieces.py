"""A markdown table cut into the pieces the chunker packs (pure Python, no Dagster).

Whole if it fits ``max_tokens``, else parts of whole rows that repeat the header, and a row too long for a chunk
with its header cut between cells, then within a cell; the table rules in full are in ``processing/chunking.py``.
"""

from __future__ import annotations

import re
from typing import Sequence

from processing.chunk_pieces import Budget, Piece, with_first_joiner, word_groups
from processing.tokenizer import count_tokens_batch, token_offsets

_TABLE_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$")
_CELL_BORDER = re.compile(r"(?<!\\)\|")


def _table_header_size(rows: Sequence[str]) -> int:
    if len(rows) >= 2 and _TABLE_SEPARATOR.match(rows[1].strip()):
        return 2
    return 1


def _cells(row: str) -> list[str]:
    inner = row.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip() for cell in _CELL_BORDER.split(inner)]


def _row(cells: Sequence[str]) -> str:
    return "|" + "|".join(cells) + "|"


def _without_synthetic_header(rows: Sequence[str]) -> list[str]:
    """The table without the `ColN` names pymupdf4llm invents for header cells a table does not have.

    A header cell is synthetic when it reads exactly `Col<its 1-based position>`; such cells become empty,
    and a header left with no name at all goes, with its separator.
    """
    rows = list(rows)
    if len(rows) < 2 or not _TABLE_SEPARATOR.match(rows[1].strip()):
        return rows
    cells = _cells(rows[0])
    named = ["" if cell == f"Col{position}" else cell for position, cell in enumerate(cells, start=1)]
    if named == cells:
        return rows
    if not any(named):
        return rows[2:]
    return [_row(named), *rows[1:]]


def _token_parts(text: str, limit: int) -> list[tuple[str, int]]:
    """`text` cut between tokens into consecutive parts of at most `limit` tokens, nothing left out."""
    offsets = token_offsets(text)
    if not offsets:
        return [(text.strip(), 0)] if text.strip() else []
    starts = [offsets[index][0] for index in range(0, len(offsets), limit)]
    parts = [text[start:end].strip() for start, end in zip(starts, [*starts[1:], len(text)])]
    counted: list[tuple[str, int]] = []
    for part, tokens in zip(parts, count_tokens_batch(parts)):
        # a word cut between its pieces can tokenize into more pieces on its own: cut that part finer
        counted.extend([(part, tokens)] if tokens <= limit else _token_parts(part, max(1, limit - (tokens - limit))))
    return counted


def _bounded_parts(text: str, limit: int, budget: Budget) -> list[tuple[str, int]]:
    """Whole-word groups of at most `limit` tokens; a word longer than that alone is cut between tokens."""
    parts: list[tuple[str, int]] = []
    for group, tokens in word_groups(text, limit, budget):
        parts.extend([(group, tokens)] if tokens <= limit else _token_parts(group, limit))
    return parts


# a table line costs one token for its leading '|'; a column costs its cell's tokens plus the '|' closing it,
# and, when its header is repeated, the header cell's tokens, its '|' and the separator's '---|' (4 tokens)
_LINE_TOKENS = 1
_SEPARATOR_CELL_TOKENS = 4


def _split_row(row: str, header: Sequence[str], budget: Budget) -> list[Piece]:
    """A row too long for one chunk, cut between cells into column groups of at most `budget.target` tokens.

    Each group repeats the header cells of its own columns (as a header line and its separator), so a cell
    stays under its column's name; a header cell too long to repeat on every piece (more than half the target)
    is left out of the repeats. A cell too long on its own is cut into word groups, then between tokens.
    """
    cells = _cells(row)
    width = max(len(cells), len(header))
    cells += [""] * (width - len(cells))
    names = list(header) + [""] * (width - len(header))
    cell_tokens = count_tokens_batch(cells)
    name_tokens = count_tokens_batch(names)
    repeat = [
        bool(name) and tokens + 1 + _SEPARATOR_CELL_TOKENS <= budget.target // 2
        for name, tokens in zip(names, name_tokens)
    ]
    has_header = any(repeat)
    base = _LINE_TOKENS * (3 if has_header else 1)

    def column_tokens(column: int, cell_tokens_: int) -> int:
        if not has_header:
            return cell_tokens_ + 1
        return cell_tokens_ + 1 + (name_tokens[column] if repeat[column] else 0) + 1 + _SEPARATOR_CELL_TOKENS

    def render(columns: Sequence[int], texts: Sequence[str]) -> str:
        lines = []
        if any(repeat[c] for c in columns):
            lines.append(_row([names[c] if repeat[c] else "" for c in columns]))
            lines.append(_row(["---"] * len(columns)))
        lines.append(_row(texts))
        return "\n".join(lines)

    pieces: list[Piece] = []
    group: list[int] = []
    group_tokens = base

    def close_group() -> None:
        if group:
            pieces.append(Piece(render(group, [cells[c] for c in group]), group_tokens, "table", "\n\n"))

    for column in range(width):
        tokens = column_tokens(column, cell_tokens[column])
        if group and group_tokens + tokens > budget.target:
            close_group()
            group, group_tokens = [], base
        if base + tokens <= budget.target:
            group.append(column)
            group_tokens += tokens
            continue
        room = max(1, budget.target - base - column_tokens(column, 0))
        for part, part_tokens in _bounded_parts(cells[column], room, budget):
            pieces.append(Piece(render([column], [part]), base + column_tokens(column, part_tokens), "table", "\n\n"))
    close_group()
    return pieces


def table_pieces(rows: Sequence[str], joiner: str, budget: Budget) -> list[Piece]:
    """A table whole if it fits `budget.maximum`; else parts of whole rows up to the target, each repeating the
    header, and any row too long for a chunk with its header cut between cells (see `_split_row`)."""
    named = _without_synthetic_header(rows)
    if not named:
        return []
    header_size = 0 if len(named) < len(rows) else _table_header_size(named)
    rows = named
    row_tokens = count_tokens_batch(rows)
    if sum(row_tokens) <= budget.maximum:
        return [Piece("\n".join(rows), sum(row_tokens), "table", joiner)]
    if header_size >= len(rows):  # header rows alone: they are the rows to split
        header_size = 0
    header, header_tokens = list(rows[:header_size]), sum(row_tokens[:header_size])
    names = _cells(rows[0]) if header_size else []
    if header_tokens > budget.target // 2:
        # too long to repeat on every part: the names go once, as a row, and the pieces of a split row still
        # repeat the names of their own columns
        rows, row_tokens = [rows[0], *rows[header_size:]], [row_tokens[0], *row_tokens[header_size:]]
        header, header_tokens, header_size = [], 0, 0
    pieces: list[Piece] = []
    part: list[str] = []
    part_tokens = header_tokens

    def close_part() -> None:
        if part:
            pieces.append(Piece("\n".join(header + part), part_tokens, "table", "\n\n"))

    for row, tokens in zip(rows[header_size:], row_tokens[header_size:]):
        if header_tokens + tokens > budget.maximum:
            close_part()
            part, part_tokens = [], header_tokens
            pieces.extend(_split_row(row, names if _cells(row) != names else [], budget))
            continue
        if part and part_tokens + tokens > budget.target:
            close_part()
            part, part_tokens = [], header_tokens
        part.append(row)
        part_tokens += tokens
    close_part()
    return with_first_joiner(pieces, joiner)
