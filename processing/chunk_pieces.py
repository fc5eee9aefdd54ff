"""The pieces the chunker packs: prose, list lines and headings cut to the token budget (pure Python, no Dagster).

A piece is at most ``target_tokens`` long where the text allows it: a paragraph too long is cut into sentences,
a sentence too long into groups of whole words. Only a whitespace-free run longer than ``max_tokens`` tokens is
cut inside, every ``target_tokens`` characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from processing.tokenizer import count_tokens, count_tokens_batch

_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)\]]))\s+")


@dataclass(frozen=True)
class Piece:
    text: str
    tokens: int
    kind: str  # heading | prose | table | overlap
    joiner: str  # whitespace put before this piece when it follows another one in a chunk


@dataclass(frozen=True)
class Budget:
    target: int
    overlap: int
    maximum: int


def _counted_words(text: str, budget: Budget) -> list[tuple[str, int]]:
    words = text.split()
    counted: list[tuple[str, int]] = []
    for word, tokens in zip(words, count_tokens_batch(words)):
        if tokens <= budget.maximum:
            counted.append((word, tokens))
            continue
        # a whitespace-free run this long is not a word anyone reads (rules, CJK runs); bound it
        parts = [word[start : start + budget.target] for start in range(0, len(word), budget.target)]
        counted.extend(zip(parts, count_tokens_batch(parts)))
    return counted


def word_groups(text: str, limit: int, budget: Budget) -> list[tuple[str, int]]:
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


def with_first_joiner(pieces: list[Piece], joiner: str) -> list[Piece]:
    if pieces:
        first = pieces[0]
        pieces[0] = Piece(first.text, first.tokens, first.kind, joiner)
    return pieces


def prose_pieces(text: str, tokens: int, joiner: str, budget: Budget) -> list[Piece]:
    """One piece if it fits the target, else sentence pieces, else word groups."""
    if tokens <= budget.target:
        return [Piece(text, tokens, "prose", joiner)]
    pieces: list[Piece] = []
    sentences = [sentence for sentence in _SENTENCE_END.split(text) if sentence.strip()]
    for sentence, sentence_tokens in zip(sentences, count_tokens_batch(sentences)):
        if sentence_tokens <= budget.target:
            pieces.append(Piece(sentence, sentence_tokens, "prose", " "))
        else:
            pieces.extend(
                Piece(group, group_tokens, "prose", " ")
                for group, group_tokens in word_groups(sentence, budget.target, budget)
            )
    return with_first_joiner(pieces, joiner)


def split_lines(lines: Sequence[str], joiner: str, budget: Budget) -> list[Piece]:
    pieces: list[Piece] = []
    for line, tokens in zip(lines, count_tokens_batch(lines)):
        pieces.extend(with_first_joiner(prose_pieces(line, tokens, "\n", budget), "\n"))
    return with_first_joiner(pieces, joiner)


def heading_pieces(line: str, budget: Budget) -> list[Piece]:
    tokens = count_tokens(line)
    if tokens <= budget.target:
        return [Piece(line, tokens, "heading", "\n\n")]
    return with_first_joiner(
        [
            Piece(group, group_tokens, "heading", " ")
            for group, group_tokens in word_groups(line, budget.target, budget)
        ],
        "\n\n",
    )
