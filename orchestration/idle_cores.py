"""How many of the machine's cores nobody is using right now: what decides whether a runner of `run --workers N`
with nothing of its own to run helps a sibling (orchestration.planning.plan_help_run).

A second runner on the same work gains only where a core is idle: a sibling's OCR (two engine threads) or embedding
(the runtime's own threads) already keeps both cores of a small machine busy, and a helper there only adds its own
engine's load and the threads' contention (measured on ../shared/corpus: 34 more core-seconds beyond the stages and
a 15 % longer run), while spaCy's extraction or a text page's conversion holds one core and leaves the other idle.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

# a core at least this idle over the sample is one a helper's run would have to itself
IDLE_CORE_AT_LEAST = 0.75
SAMPLE_S = 0.25


def idle_share(before: Sequence[int], after: Sequence[int]) -> float | None:
    """The share of all cores' time that was idle between two readings of /proc/stat's `cpu` line (user, nice,
    system, idle, iowait, irq, softirq, steal, ...: guest time is already in user); None when no time passed."""
    busy_fields = 8
    spent = sum(after[:busy_fields]) - sum(before[:busy_fields])
    if spent <= 0:
        return None
    idle = (after[3] + after[4]) - (before[3] + before[4])
    return max(0.0, min(1.0, idle / spent))


def _cpu_line() -> list[int]:
    with open("/proc/stat", encoding="ascii") as stat:
        return [int(value) for value in stat.readline().split()[1:]]


def idle_cores(sample_s: float = SAMPLE_S) -> float | None:
    """Cores the whole machine left idle over the next `sample_s` seconds (other users' work counts as busy);
    None where /proc/stat cannot tell."""
    try:
        before = _cpu_line()
        time.sleep(sample_s)
        share = idle_share(before, _cpu_line())
    except (OSError, ValueError, IndexError):
        return None
    return None if share is None else share * (os.cpu_count() or 1)


def has_an_idle_core() -> bool:
    """Whether a core is idle now; where that cannot be told, as if one were."""
    idle = idle_cores()
    return idle is None or idle >= IDLE_CORE_AT_LEAST
