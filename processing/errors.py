"""Why a document, or one of its pages, cannot be turned into page markdown: one sentence and an error class.
The class decides whether the queue retries the task."""

from __future__ import annotations

ERROR_CLASSES = frozenset(
    {
        "encrypted",
        "corrupt",
        "too_large",
        "empty",
        "timeout",
        "resource_limit",
        "unsupported",
        "missing_file",
        "internal",
    }
)
_NOT_RETRYABLE = frozenset({"encrypted", "corrupt", "too_large", "empty", "unsupported", "missing_file"})


class DocumentError(Exception):
    """A document (or one of its pages) that could not be converted, and why."""

    def __init__(self, reason: str, error_class: str, retryable: bool | None = None):
        if error_class not in ERROR_CLASSES:
            raise ValueError(f"unknown error_class {error_class!r}")
        super().__init__(reason)
        self.reason = reason
        self.error_class = error_class
        self.retryable = (error_class not in _NOT_RETRYABLE) if retryable is None else retryable

    def __reduce__(self):
        return (DocumentError, (self.reason, self.error_class, self.retryable))

    def __str__(self) -> str:
        return self.reason
