"""A document's similarity signature: MinHash over word shingles of its page texts, cut into LSH bands.

Two documents whose shingle sets have Jaccard similarity J agree on each MinHash value with probability J, so the
share of equal values estimates J. The signature is cut into `BANDS` bands of `ROWS` values; documents sharing a
band's hash are candidates (the probability is 1 - (1 - J^ROWS)^BANDS: 0.9999 at J = 0.8, 0.53 at J = 0.5, 0.06 at
J = 0.3), and only candidates are compared. Every constant here is part of the stored format: the hash functions'
coefficients come from a fixed seed through blake2b, never from Python's per-process hash or a random generator,
so a signature computed by another process or another version of docqueue is the same and stays comparable.

The words are those of processing/words.py (letters and digits, markup left out), so a text-layer page's emphasis
and HTML tags do not tell it from its re-scan; a text without markup signs as it always did, and a document signed
while tags still counted keeps that signature until its OCR roll-up is redone (`docqueue reindex --phase ocr`).

Pure: text in, integers out. The shingle and character bounds are the caller's settings (DOCQUEUE_NEAR_DUP_*).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from processing.words import text_words

NUM_PERM = 120  # MinHash values per signature
BANDS = 24
ROWS = NUM_PERM // BANDS  # values per band
SHINGLE_WORDS = 4  # one word changed in a page of 100 words leaves J ≈ 0.92 at four-word shingles
# the hash family h(x) = (a·x + b) mod p over 31-bit shingle hashes: a·x + b < 2^63, so uint64 never overflows
PRIME = (1 << 31) - 1
SEED = b"docqueue-near-duplicates-v1"


def _coefficients() -> tuple[np.ndarray, np.ndarray]:
    digest = b"".join(hashlib.blake2b(SEED + i.to_bytes(2, "big"), digest_size=8).digest() for i in range(NUM_PERM))
    words = np.frombuffer(digest, dtype=">u8").astype(np.uint64)
    a = (words >> np.uint64(32)) % np.uint64(PRIME - 1) + np.uint64(1)  # never 0
    b = (words & np.uint64(0xFFFFFFFF)) % np.uint64(PRIME)
    return a.reshape(-1, 1), b.reshape(-1, 1)


_A, _B = _coefficients()


@dataclass(frozen=True)
class SignatureLimits:
    """What one signature reads at most: characters of page text and distinct shingles (the settings
    DOCQUEUE_NEAR_DUP_MAX_CHARS and DOCQUEUE_NEAR_DUP_MAX_SHINGLES, handed in by the caller)."""

    max_chars: int = 2_000_000
    max_shingles: int = 20_000


@dataclass(frozen=True)
class Signature:
    """MinHash values (NUM_PERM integers below 2^31) and how many distinct shingles they summarise."""

    values: tuple[int, ...]
    shingles: int

    def bands(self) -> list[tuple[int, int]]:
        """(band number, signed 64-bit hash of the band's values): the rows of the band table."""
        found = []
        for band in range(BANDS):
            part = self.values[band * ROWS : (band + 1) * ROWS]
            digest = hashlib.blake2b(b"".join(v.to_bytes(4, "big") for v in part), digest_size=8).digest()
            found.append((band, int.from_bytes(digest, "big", signed=True)))
        return found


def shingle_hashes(texts: Iterable[str], limits: SignatureLimits = SignatureLimits()) -> np.ndarray:
    """31-bit hashes of the distinct word shingles of `texts` (lower-cased words, markup left out, SHINGLE_WORDS at
    a time, across page breaks), reading at most `limits.max_chars` characters and keeping the first
    `limits.max_shingles`."""
    budget, words = limits.max_chars, []
    for text in texts:
        if budget <= 0:
            break
        words += text_words(text[:budget].lower())
        budget -= len(text)
    if not words:
        return np.empty(0, dtype=np.uint64)
    width = min(SHINGLE_WORDS, len(words))
    seen: dict[int, None] = {}
    for i in range(len(words) - width + 1):
        shingle = " ".join(words[i : i + width]).encode()
        seen.setdefault(int.from_bytes(hashlib.blake2b(shingle, digest_size=4).digest(), "big") % PRIME)
        if len(seen) >= limits.max_shingles:
            break
    return np.fromiter(seen, dtype=np.uint64, count=len(seen))


def signature(texts: Iterable[str], limits: SignatureLimits = SignatureLimits()) -> Signature | None:
    """The MinHash signature of the page texts; None when they hold no word (such a document has no copies)."""
    hashes = shingle_hashes(texts, limits)
    if hashes.size == 0:
        return None
    values = ((_A * hashes.reshape(1, -1) + _B) % np.uint64(PRIME)).min(axis=1)
    return Signature(values=tuple(int(v) for v in values), shingles=int(hashes.size))


def estimated_jaccard(first: Signature, second: Signature) -> float:
    """The share of equal MinHash values: an unbiased estimate of the shingle sets' Jaccard similarity (the
    queue's candidate comparison, queue_db/near_duplicates.py, computes the same in SQL)."""
    return sum(x == y for x, y in zip(first.values, second.values)) / NUM_PERM
