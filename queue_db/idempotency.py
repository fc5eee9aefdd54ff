"""Idempotency keys of document registration: what a valid key is, and the refusal of a key reused for other bytes.

A key names one registration chosen by the caller (a request id, a message id): the same key again is the same
document, whatever the name; the same key with different content is a caller's mistake, refused, never merged.
"""

from __future__ import annotations

MAX_KEY_CHARS = 255  # the column is VARCHAR(255) (migrations/0013)


class IdempotencyConflict(ValueError):
    """The key already names a document with other content."""

    def __init__(self, key: str, document_key: str):
        super().__init__(f"idempotency key {key!r} was already used for different content (document {document_key})")
        self.key = key
        self.document_key = document_key


def checked_key(key: str | None) -> str | None:
    """The key itself, or ValueError with the rule it breaks; None stays None (no key)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise ValueError("an idempotency key must be non-empty text")
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(f"an idempotency key must be at most {MAX_KEY_CHARS} characters, got {len(key)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError("an idempotency key must not contain control characters")
    return key
