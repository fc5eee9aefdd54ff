"""The idle share of the machine's cores between two readings of /proc/stat, which decides whether a runner of
`run --workers N` helps a sibling (orchestration.idle_cores)."""

from __future__ import annotations

import pytest

from orchestration import idle_cores
from orchestration.idle_cores import idle_share

#           user nice system idle iowait irq softirq steal guest guest_nice
BEFORE = [1000, 0, 500, 8000, 100, 0, 0, 0, 40, 0]


def _after(user: int, idle: int, iowait: int = 0, guest: int = 0) -> list[int]:
    return [BEFORE[0] + user, 0, 500, BEFORE[3] + idle, BEFORE[4] + iowait, 0, 0, 0, 40 + guest, 0]


def test_idle_and_iowait_count_as_idle_and_guest_time_not_twice():
    assert idle_share(BEFORE, _after(user=50, idle=50)) == pytest.approx(0.5)
    assert idle_share(BEFORE, _after(user=50, idle=30, iowait=20)) == pytest.approx(0.5)
    # guest time is inside user already: counted once
    assert idle_share(BEFORE, _after(user=50, idle=50, guest=50)) == pytest.approx(0.5)
    assert idle_share(BEFORE, _after(user=100, idle=0)) == 0.0


def test_no_time_between_the_readings_tells_nothing():
    assert idle_share(BEFORE, list(BEFORE)) is None


def test_a_machine_that_cannot_tell_is_taken_as_having_an_idle_core(monkeypatch):
    def unreadable():
        raise OSError("no /proc here")

    monkeypatch.setattr(idle_cores, "_cpu_line", unreadable)
    assert idle_cores.idle_cores(0.0) is None
    assert idle_cores.has_an_idle_core() is True


def test_a_busy_machine_has_no_idle_core(monkeypatch):
    readings = iter([BEFORE, _after(user=190, idle=10)])
    monkeypatch.setattr(idle_cores, "_cpu_line", lambda: next(readings))
    monkeypatch.setattr(idle_cores.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(idle_cores.time, "sleep", lambda s: None)
    assert idle_cores.idle_cores() == pytest.approx(0.1)
    readings = iter([BEFORE, _after(user=100, idle=100)])
    assert idle_cores.has_an_idle_core() is True  # half of two cores: one idle
