"""Where a worker of `docqueue run --workers N` waits between passes (orchestration.workers.SiblingWait), with the
siblings' locks and the news replaced by scripted ones: a sibling's run ends the wait, a sibling going idle only
makes it look again, and a worker leaves once nobody is busy and nothing is left (or the same work stays unplanned)."""

from __future__ import annotations

import pytest

from orchestration import workers
from orchestration.workers import STUCK_CHECKS, SiblingWait
from queue_db.progress_signal import News


class Siblings:
    def __init__(self, busy: list[bool]):
        self.busy, self.checks = list(busy), 0

    def any_busy(self) -> bool:
        self.checks += 1
        return self.busy.pop(0) if len(self.busy) > 1 else self.busy[0]


class Listener:
    def __init__(self, news: list[News | None]):
        self.news, self.waits = list(news), 0

    def wait(self, timeout_s: float) -> News | None:
        self.waits += 1
        return self.news.pop(0) if self.news else None


@pytest.fixture
def left(monkeypatch):
    """The work left anywhere, as the test sets it."""
    state = {"left": {}}
    monkeypatch.setattr(workers, "work_left", lambda queue, phases: dict(state["left"]))
    return state


def test_a_siblings_run_ends_the_wait_for_a_pass(left):
    siblings, listener = Siblings([True]), Listener([News.IDLE, News.IDLE, News.RAN])
    assert SiblingWait(siblings, listener, None, None).until_work_may_be_here() is False
    assert listener.waits == 3 and siblings.checks == 3  # each idle news: a look, not a pass


def test_the_poll_ends_the_wait_for_a_pass_when_nothing_is_heard(left):
    listener = Listener([None])
    assert SiblingWait(Siblings([True]), listener, None, None).until_work_may_be_here() is False
    assert listener.waits == 1


def test_a_worker_leaves_once_nobody_is_busy_and_nothing_is_left(left):
    siblings, listener = Siblings([True, False]), Listener([News.IDLE])
    assert SiblingWait(siblings, listener, None, None).until_work_may_be_here() is True
    assert listener.waits == 1  # the sibling's idle news was the reason to look


def test_work_left_while_nobody_is_busy_is_waited_for(left):
    left["left"] = {"ready_ocr_page": 3}
    siblings, listener = Siblings([False]), Listener([News.IDLE, News.RAN])
    assert SiblingWait(siblings, listener, None, None).until_work_may_be_here() is False


def test_the_same_work_left_unplanned_ends_the_worker_after_the_stuck_checks(left):
    left["left"] = {"ready_ocr_page": 3}
    wait = SiblingWait(Siblings([False]), Listener([]), None, None)
    passes = 0
    while not wait.until_work_may_be_here():
        passes += 1
        assert passes <= STUCK_CHECKS
    assert passes == STUCK_CHECKS


def test_work_held_elsewhere_never_counts_as_stuck(left):
    left["left"] = {"ready_ocr_page": 3, "processing": 2}
    wait = SiblingWait(Siblings([False]), Listener([]), None, None)
    assert not any(wait.until_work_may_be_here() for _ in range(3 * STUCK_CHECKS))
