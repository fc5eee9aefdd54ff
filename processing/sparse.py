"""Sparse (BM25-style) term vectors for hybrid search, computed locally without a model.

A text becomes lowercase unicode words minus a small stopword list. Each term's id is the CRC-32
of its UTF-8 bytes, so every process (worker, CLI, benchmark) maps a term to the same dimension
without a shared vocabulary. Its weight is BM25's term-frequency part,

    tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / AVERAGE_LENGTH))

against a fixed average length (chunks are bounded, so a corpus-wide average adds nothing but a
dependency on what else is stored); the IDF part is left to Qdrant, whose sparse vector `text`
carries `Modifier.IDF` and computes it from the collection at query time. A query's weights are
plain 1s per distinct term: BM25 sums IDF times the document's weight over the query's terms.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter

K1 = 1.2
B = 0.75
AVERAGE_LENGTH = 200.0  # words in a typical chunk (chunks hold at most 400 tokens)

STOPWORDS = frozenset(
    """
a an and are as at be but by for from has have he her his i in is it its not of on or she that the their them
they this to was we were which will with you your
""".split()
)

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def tokens(text: str) -> list[str]:
    """Lowercase unicode words (letters and digits) of `text`, stopwords left out."""
    return [word for word in _WORD.findall((text or "").lower()) if word not in STOPWORDS]


def term_id(term: str) -> int:
    """The term's dimension: CRC-32 of its UTF-8 bytes, the same in every process."""
    return zlib.crc32(term.encode("utf-8"))


def _vector(weights: dict[int, float]) -> tuple[list[int], list[float]]:
    indices = sorted(weights)
    return indices, [weights[i] for i in indices]


def document_vector(text: str) -> tuple[list[int], list[float]]:
    """(indices, values) of a stored text: BM25 term-frequency weights; empty when it has no words."""
    words = tokens(text)
    norm = K1 * (1 - B + B * len(words) / AVERAGE_LENGTH)
    weights: dict[int, float] = {}
    for term, tf in Counter(words).items():
        # two terms sharing a CRC-32 add up, as BM25 would score them if they were one term
        weights[term_id(term)] = weights.get(term_id(term), 0.0) + tf * (K1 + 1) / (tf + norm)
    return _vector(weights)


def query_vector(text: str) -> tuple[list[int], list[float]]:
    """(indices, values) of a query: 1 per distinct term; empty when it has no words."""
    return _vector({term_id(term): 1.0 for term in set(tokens(text))})
