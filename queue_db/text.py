"""Text as the queue stores it: no NUL bytes, undecodable bytes shown as escapes, bounded length."""

from __future__ import annotations

from typing import overload

MAX_ERROR_CHARS = 4000


@overload
def clean_text(value: str, limit: int = MAX_ERROR_CHARS) -> str: ...


@overload
def clean_text(value: None, limit: int = MAX_ERROR_CHARS) -> None: ...


@overload
def clean_text(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None: ...


def clean_text(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None:
    """PostgreSQL text cannot hold NUL; keep everything else verbatim, bounded."""
    if value is None:
        return None
    value = value.replace("\x00", "\\x00")
    try:  # undecodable bytes (surrogate escapes from file names) are shown as \xNN rather than refused
        value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def source_path_text(path: str) -> str:
    """A file path as documents.source_path holds it (and as lookups by path must give it): undecodable bytes of
    the name as \\xNN escapes, bounded."""
    return clean_text(path, 10000)
