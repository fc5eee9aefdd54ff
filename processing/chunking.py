"""Adaptive chunking of one page's markdown for the vector phase (pure Python, no Dagster).

Token counts are exact WordPiece counts from the embedding model's own tokenizer
(``processing/tokenizer.py``), without the special tokens the model adds. The count of pieces
joined by whitespace is the sum of their counts; the packer relies on that and every chunk's
``token_count`` is measured again at the end. Markdown is read into blocks by
``processing/markdown_blocks.py``, prose and headings are cut into pieces by
``processing/chunk_pieces.py`` and tables by ``processing/table_pieces.py``.

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

from processing.chunk_pieces import Budget, Piece, heading_pieces, prose_pieces, split_lines
from processing.markdown_blocks import Block, heading_title, list_items, parse_blocks
from processing.table_pieces import table_pieces
from processing.tokenizer import count_tokens, count_tokens_batch
from queue_db.config import StorageConfig, default
from queue_db.keys import chunk_id_for

HEADING_SEPARATOR = " > "
_SENTENCE_ENDINGS = (".", "!", "?")


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


def _block_pieces(block: Block, budget: Budget) -> list[Piece]:
    joiner = "\n\n"
    if block.kind == "table":
        return table_pieces(block.lines, joiner, budget)
    if block.kind == "paragraph":
        text = " ".join(line.strip() for line in block.lines)
        return prose_pieces(text, count_tokens(text), joiner, budget)
    items = list_items(block.lines) if block.kind == "list" else list(block.lines)
    whole = "\n".join(items)
    tokens = count_tokens(whole)
    if tokens <= budget.target:
        return [Piece(whole, tokens, "prose", joiner)]
    return split_lines(items, joiner, budget)


# --------------------------------------------------------------------------- packing


def _tail_words(text: str, limit: int) -> str:
    """The longest run of whole trailing words within `limit` tokens, from a sentence start if possible."""
    words = text.split()[-(max(limit, 1) + 1) :]  # a word is at least one token; one more shows the context
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
            return " ".join(tail[offset + 1 :])
    return " ".join(tail)


class _Packer:
    def __init__(self, budget: Budget, max_chunks: int):
        self.budget = budget
        self.max_chunks = max_chunks
        self.chunks: list[tuple[str, str]] = []
        self.pieces: list[Piece] = []
        self.tokens = 0
        self.has_body = False
        self.heading = ""

    def add_heading(self, piece: Piece, path: str) -> None:
        if self.has_body:
            self.flush()
        if self.tokens + piece.tokens > self.budget.maximum and self.pieces:
            self.flush()
        self._append(piece)
        self.heading = path

    def add_body(self, piece: Piece) -> None:
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

    def _overlap_for(self, following: Piece) -> Piece | None:
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
        return Piece(tail, count_tokens(tail), "overlap", "")

    def _append(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.tokens += piece.tokens

    def flush(self) -> None:
        if not self.pieces:
            return
        if len(self.chunks) >= self.max_chunks:
            raise TooManyChunksError(f"page produces more than {self.max_chunks} chunks (DOCQUEUE_MAX_CHUNKS_PER_PAGE)")
        text = self.pieces[0].text + "".join(piece.joiner + piece.text for piece in self.pieces[1:])
        self.chunks.append((text.strip(), self.heading))
        self.pieces, self.tokens, self.has_body = [], 0, False


def _validate(target_tokens: int, overlap_tokens: int, max_tokens: int) -> Budget:
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be at least 1, got {target_tokens}")
    if not 0 <= overlap_tokens < target_tokens:
        raise ValueError(f"overlap_tokens must be in [0, target_tokens), got {overlap_tokens}")
    if max_tokens < target_tokens:
        raise ValueError(f"max_tokens ({max_tokens}) must be at least target_tokens ({target_tokens})")
    return Budget(target_tokens, overlap_tokens, max_tokens)


# The WordPiece tokenizer turns any word longer than 100 characters into one [UNK] token, so token counts alone
# would let a garbage run (a broken text layer) of megabytes become one "1-token" chunk. Such runs are cut into
# 100-character words first (table rows are left alone: their cells are separated by '|'), and a page is
# refused above MAX_CHARS_PER_TOKEN characters per token of its chunk budget.
LONG_RUN = re.compile(r"[^\s|]{101,}")
MAX_CHARS_PER_TOKEN = 20


def break_long_runs(text: str) -> str:
    return LONG_RUN.sub(lambda m: " ".join(m.group(0)[i : i + 100] for i in range(0, len(m.group(0)), 100)), text)


def chunk_markdown(
    markdown: str,
    *,
    page_key: str,
    target_tokens: int = 256,
    overlap_tokens: int = 32,
    max_tokens: int = 400,
    max_chunks: int = MAX_CHUNKS_PER_PAGE,
) -> list[Chunk]:
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
            f"{max_tokens} tokens can hold"
        )
    markdown = break_long_runs(markdown)
    words = len(markdown.split())
    if words > limit * max_tokens:  # every word is at least one token: fail fast on runaway pages
        raise TooManyChunksError(
            f"page has {words} words, more than {limit} chunks (DOCQUEUE_MAX_CHUNKS_PER_PAGE) of "
            f"{max_tokens} tokens can hold"
        )
    packer = _Packer(budget, limit)
    path: list[tuple[int, str]] = []
    for block in parse_blocks(markdown):
        if block.kind == "heading":
            path = [(level, title) for level, title in path if level < block.level]
            path.append((block.level, heading_title(block.lines[0])))
            heading_path = HEADING_SEPARATOR.join(title for _, title in path if title)
            for piece in heading_pieces(block.lines[0], budget):
                packer.add_heading(piece, heading_path)
            continue
        for piece in _block_pieces(block, budget):
            packer.add_body(piece)
    packer.flush()
    return _finish(packer.chunks, page_key)


def _finish(raw: list[tuple[str, str]], page_key: str) -> list[Chunk]:
    texts = [text for text, _ in raw]
    chunks = []
    for index, ((text, heading), tokens) in enumerate(zip(raw, count_tokens_batch(texts))):
        content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
        chunks.append(
            Chunk(
                index=index,
                text=text,
                chunk_id=chunk_id_for(page_key, index, content_hash),
                content_hash=content_hash,
                token_count=tokens,
                heading=heading,
            )
        )
    return chunks
