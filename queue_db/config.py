"""Settings shared by every layer, read from environment variables.

Defaults follow the seed's Configuration block (hierarchical-task-queue-v2.md):
poll 5 s, heartbeat 30 s, stale after 120 s, 3 retries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def docqueue_home() -> Path:
    """Root of everything the embedded setup keeps on disk (DOCQUEUE_HOME, default ./.docqueue)."""
    home = Path(os.environ.get("DOCQUEUE_HOME", ".docqueue")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    """A whole-number environment setting; a typo says which variable it is in."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    """A numeric environment setting; a typo says which variable it is in."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class QueueSettings:
    poll_interval_s: float = 5.0
    heartbeat_interval_s: float = 30.0
    stale_timeout_s: float = 120.0
    max_retries: int = 3
    # back-off before a failed task may be claimed again: base * 2**(attempt-1), capped
    retry_backoff_base_s: float = 10.0
    retry_backoff_max_s: float = 600.0
    claim_batch_size: int = 50
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "QueueSettings":
        return cls(
            poll_interval_s=env_float("WORKER_POLL_INTERVAL", 5.0),
            heartbeat_interval_s=env_float("HEARTBEAT_INTERVAL", 30.0),
            stale_timeout_s=env_float("STALE_TASK_TIMEOUT", 120.0),
            max_retries=env_int("MAX_TASK_RETRIES", 3),
            retry_backoff_base_s=env_float("DOCQUEUE_RETRY_BACKOFF_BASE", 10.0),
            retry_backoff_max_s=env_float("DOCQUEUE_RETRY_BACKOFF_MAX", 600.0),
            claim_batch_size=env_int("DOCQUEUE_CLAIM_BATCH_SIZE", 50),
        )

    def backoff_seconds(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1` may start (attempt counts failures so far, >= 1)."""
        return min(self.retry_backoff_max_s, self.retry_backoff_base_s * (2 ** max(0, attempt - 1)))
