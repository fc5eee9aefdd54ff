"""The back-off rule of failed tasks (`RetryPolicy`), the one place it lives: a phase's spec holds one per kind
(queue_db/phases.py) and the fail statement's SQL is made from it."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed task may run again: `base_s * 2**retries` seconds after its failure, at most `cap_s`, less a
    random share of up to `jitter` (0..1) of that delay; `attempts` failed attempts at most: the registry's
    default policy gives new rows their max_retries (an operator may change a row's), a kind's own policy is the
    limit of that kind's tasks whatever their rows say.
    The one place the back-off rule lives: the fail statement's SQL and `delay_seconds` are both made here."""

    base_s: float = 10.0
    cap_s: float = 600.0
    attempts: int = 3
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0 or self.attempts < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid retry policy {self}")

    def delay_seconds(self, retries: int, draw: float | None = None) -> float:
        """The back-off after a task that has failed `retries` times before this failure (0 on its first).
        `draw` in [0, 1) stands for the random draw of the jitter (None: draw one)."""
        delay = min(self.cap_s, self.base_s * 2 ** max(0, retries))
        if self.jitter:
            delay *= 1 - self.jitter * (random.random() if draw is None else draw)
        return delay

    def delay_sql(self, retries_sql: str) -> str:
        """The same delay in seconds as an SQL float8 expression of the retry count expression `retries_sql`."""
        delay = f"LEAST({float(self.cap_s)!r}::float8, {float(self.base_s)!r}::float8 * power(2, {retries_sql}))"
        if self.jitter:
            delay = f"({delay} * (1 - {float(self.jitter)!r}::float8 * random()))"
        return delay

    def next_attempt_sql(self, retries_sql: str) -> str:
        """When a retryable failure may be claimed again (over the retry count before this failure)."""
        return f"now() + make_interval(secs => {self.delay_sql(retries_sql)})"

    @classmethod
    def from_settings(
        cls, max_retries: int, backoff_base_s: float, backoff_max_s: float, jitter: float = 0.0
    ) -> "RetryPolicy":
        return cls(base_s=backoff_base_s, cap_s=backoff_max_s, attempts=max_retries, jitter=jitter)
