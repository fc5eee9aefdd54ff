"""A document's similarity signature: MinHash over character shingles of its page texts, folded, cut into LSH bands.

Two documents whose shingle sets have Jaccard similarity J agree on each MinHash value with probability J, so the
share of equal values estimates J. The signature is cut into `BANDS` bands of `ROWS` values; documents sharing a
band's hash are candidates (the probability is 1 - (1 - J^ROWS)^BANDS: 0.9999 at J = 0.8, 0.53 at J = 0.5, 0.06 at
J = 0.3), and only candidates are compared. Every constant here is part of the stored format (`FORMAT`): the hash
functions' coefficients come from a fixed seed through blake2b, never from Python's per-process hash or a random
generator, so a signature computed by another process or another version of docqueue with the same format is the
same and stays comparable; signatures of another format are never compared (queue_db/near_duplicates.py), and
`docqueue regroup` signs the documents of an older one again.

What is shingled is the pages' words (processing/words.py: letters and digits, markup left out), folded so that
what a reader cannot tell apart compares equal: case, diacritics (`é` and `e`: OCR drops accents) and the Cyrillic
and Greek letters whose capitals print as Latin ones (`С` and `C`: a bad text layer reads Russian as Latin
look-alikes, an OCR engine may read the same print either way). The folded words, one space between them, across
page breaks, are cut into `SHINGLE_CHARS`-character shingles. Characters, not words: a letter read wrong by OCR
spoils the six shingles over it where it spoils every four-word shingle holding its word, and a form whose fields
come out in another order (short blocks, few words each) loses only the shingles across each block's ends. On
bench/retrieval.py's planted corpus a text-layer form and its version measure 0.81 exact, 0.80 estimated (0.61 and
0.69 over four-word shingles, under the threshold 0.7); documents of different families at most 0.033, and
documents sharing only a notice page 0.35-0.47.

Pure: text in, integers out. The character and shingle bounds are the caller's settings (DOCQUEUE_NEAR_DUP_*).
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from processing.words import text_words

# the stored format: a signature of another format (an older docqueue's) is never compared with this one's
FORMAT = 2
NUM_PERM = 120  # MinHash values per signature
BANDS = 24
ROWS = NUM_PERM // BANDS  # values per band
SHINGLE_CHARS = 6  # unrelated documents share few 6-character runs of folded words (at most 0.033 measured)
# MinHash values come from the multiply-shift family h(x) = ((a·x + b) mod 2^64) >> 33 over 64-bit shingle hashes:
# 31-bit values (PostgreSQL's integer), computed with uint64 arithmetic that wraps, without a division
VALUE_BITS = 31
SEED = b"docqueue-near-duplicates-v2"
# a shingle's 64-bit hash: its code points as a polynomial in this odd base, modulo 2^64
SHINGLE_BASE = 0x9E3779B97F4A7C15
# MinHash values are taken over this many shingles at a time, so memory stays NUM_PERM × this × 8 bytes
_BLOCK = 8192

# Cyrillic and Greek lower-case letters whose capitals print as a Latin capital, folded to that Latin letter
_LOOK_ALIKES = str.maketrans("авекмнорстухѕіј" + "αβεζηικμνορτυχ", "abekmhopctyxsij" + "abezhikmnoptyx")


def _coefficients() -> tuple[np.ndarray, np.ndarray]:
    digest = b"".join(hashlib.blake2b(SEED + i.to_bytes(2, "big"), digest_size=16).digest() for i in range(NUM_PERM))
    words = np.frombuffer(digest, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    a = words[:, 0] | np.uint64(1)  # odd, as multiply-shift hashing needs
    return a.reshape(-1, 1), words[:, 1].reshape(-1, 1)


_A, _B = _coefficients()


@dataclass(frozen=True)
class SignatureLimits:
    """What one signature reads at most: characters of page text and distinct shingles (the settings
    DOCQUEUE_NEAR_DUP_MAX_CHARS and DOCQUEUE_NEAR_DUP_MAX_SHINGLES, handed in by the caller)."""

    max_chars: int = 2_000_000
    max_shingles: int = 100_000


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


def folded(text: str) -> str:
    """`text` with case, diacritics and the Latin look-alike Cyrillic and Greek letters folded away."""
    if text.isascii():  # nothing to fold but case: most text, at a fraction of the cost
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c)).translate(_LOOK_ALIKES)


def shingle_text(texts: Iterable[str], max_chars: int) -> str:
    """The folded words of `texts` (at most `max_chars` characters of them read), one space between them."""
    budget, parts = max_chars, []
    for text in texts:
        if budget <= 0:
            break
        words = text_words(folded(text[:budget]))
        budget -= len(text)
        if words:
            parts.append(" ".join(words))
    return " ".join(parts)


def shingle_hashes(texts: Iterable[str], limits: SignatureLimits = SignatureLimits()) -> np.ndarray:
    """64-bit hashes of the distinct character shingles of `texts` (`shingle_text`, SHINGLE_CHARS at a time; a
    shorter text is one shingle), reading at most `limits.max_chars` characters and keeping the first
    `limits.max_shingles`."""
    text = shingle_text(texts, limits.max_chars)
    if not text:
        return np.empty(0, dtype=np.uint64)
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    width = min(SHINGLE_CHARS, points.size)
    count = points.size - width + 1
    hashes = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # modulo 2^64 on purpose
        for offset in range(width):
            hashes = hashes * np.uint64(SHINGLE_BASE) + points[offset : offset + count]
    # distinct, in the order they first occur: the bound keeps a document's beginning
    _, first = np.unique(hashes, return_index=True)
    return hashes[np.sort(first)[: limits.max_shingles]]


def signature(texts: Iterable[str], limits: SignatureLimits = SignatureLimits()) -> Signature | None:
    """The MinHash signature of the page texts; None when they hold no word (such a document has no copies)."""
    hashes = shingle_hashes(texts, limits)
    if hashes.size == 0:
        return None
    values = np.full(NUM_PERM, 1 << VALUE_BITS, dtype=np.uint64)
    shift = np.uint64(64 - VALUE_BITS)
    with np.errstate(over="ignore"):  # modulo 2^64 on purpose
        for start in range(0, hashes.size, _BLOCK):
            block = hashes[start : start + _BLOCK].reshape(1, -1)
            values = np.minimum(values, ((_A * block + _B) >> shift).min(axis=1))
    return Signature(values=tuple(int(v) for v in values), shingles=int(hashes.size))


def estimated_jaccard(first: Signature, second: Signature) -> float:
    """The share of equal MinHash values: an unbiased estimate of the shingle sets' Jaccard similarity (the
    queue's candidate comparison, queue_db/near_duplicates.py, computes the same in SQL)."""
    return sum(x == y for x, y in zip(first.values, second.values)) / NUM_PERM
