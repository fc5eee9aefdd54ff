"""Which copy of a content group stands for the group in search results.

Near-duplicate documents (a version with a word changed, a re-scan) give chunks whose vectors and sparse weights
are all but equal, so which copy ranks first is close to chance. The words the query shares with each copy's text
are not: the copy holding the query's own word pairs (a changed word, a phrase OCR read another way) is the one
the user meant. Ties keep the search's own order."""

from __future__ import annotations

from typing import Sequence, TypeVar

from processing.words import text_words

T = TypeVar("T")


def _words(text: str) -> list[str]:
    # markup left out: a text-layer copy's `_loop traces_` holds the words `loop traces` its re-scan holds
    return text_words(text.casefold())


def word_pairs(text: str) -> set[tuple[str, str]]:
    words = _words(text)
    return set(zip(words, words[1:]))


def best_copy(query: str, candidates: Sequence[T], text_of) -> T:
    """The candidate (best first) whose text (`text_of(candidate)`) shares the most word pairs with `query`; the
    first of those on a tie. A query of one word compares that word instead."""
    wanted = word_pairs(query) or {(w, "") for w in _words(query)}
    if len(candidates) == 1 or not wanted:
        return candidates[0]

    def shared(candidate: T) -> int:
        text = text_of(candidate) or ""
        have = word_pairs(text) if any(b for _, b in wanted) else {(w, "") for w in _words(text)}
        return len(wanted & have)

    # max keeps the first of equal scores: the search's own order decides a tie
    return max(candidates, key=shared)
