"""The fault matrix's row 8 (bench/faults.py) at a tiny size, on a PostgreSQL of its own: a worker whose wall clock
runs ten minutes ahead and one ten minutes behind (under libfaketime), beside a normal one, while stale recovery runs
from a process ten minutes ahead and from a normal one. The stale timeout is 3 s and each batch's work takes 4 s,
so a heartbeat or a staleness judged by any process's clock would release live tasks; the queue judges all of it by
the database's clock, so none is released, stolen, lost or completed twice, and a retryable failure made by a
skewed process is claimable after the configured back-off; the figures of the full row are in
docs/benchmarks.md."""

from __future__ import annotations

import pytest

from tests.reliability.support import figures_line


@pytest.fixture(scope="module")
def libfaketime():
    from bench._fault_kit import LIBFAKETIME_GLOB, libfaketime

    path = libfaketime()
    if path is None:
        pytest.skip(
            f"no libfaketime at {LIBFAKETIME_GLOB}: install Debian's `libfaketime` package "
            "(apt-get install libfaketime)"
        )
    return path


def test_workers_whose_clocks_are_ten_minutes_off_neither_steal_nor_are_robbed(libfaketime, say):
    from bench import faults

    args = faults.parse_args(["--rows", "8", "--quick", "--no-clean", "--tasks", "3000", "--max-connections", "30"])
    args.workers, args.skew_window_s = 3, 9.0  # one normal worker beside the two skewed ones
    bench = faults.Bench(args)
    try:
        figures = faults.clock_skew(bench)
    finally:
        bench.close()

    # the fault took: each skewed process's wall clock was 600 s off the database's, from its start to its end,
    # while its monotonic clock stayed the machine's (its heartbeat thread's waits depend on it)
    assert set(figures["clocks"]) == {"worker+600", "worker-600", "recovery+600"}, figures["clocks"]
    for name, clock in figures["clocks"].items():
        expected = -600 if "-" in name else 600
        assert abs(clock["wall_skew_s"] - expected) < 5, (name, clock)
        assert abs(clock["wall_skew_s_at_end"] - expected) < 5, (name, clock)
        assert abs(clock["monotonic_offset_s"]) < 1, (name, clock)
    assert figures["clock_not_skewed"] == [], figures
    # and it has teeth: judged by the clock ahead, the held tasks would have been stale
    assert figures["would_release_by_own_clock"] > 0, figures

    assert figures["tasks_lost"] == 0, figures
    assert figures["completed_twice"] == 0, figures
    assert figures["live_tasks_released"] == 0, figures  # no worker died: every release would be a steal
    assert figures["fenced_rejected"] == 0, figures  # nobody was robbed of a task in hand
    assert figures["rollup_mismatches"] == 0 and figures["reconcile_corrections"] == 0, figures
    assert figures["errors"] == [], figures["errors"]
    assert figures["recovery_calls"]["normal"] > 0 and figures["recovery_calls"]["skewed"] > 0, figures
    # the skewed workers completed batches whose work outlasted the stale timeout: their heartbeats kept them
    for app, worker in figures["skewed_workers"].items():
        assert worker["completed"] > 0 and worker["heartbeats"] > 0, (app, worker)

    backoff = figures["backoff"]
    assert figures["backoff_wrong"] == [], backoff
    for skew in ("+600", "-600"):
        assert backoff[skew]["failed"] == 10, backoff
        assert backoff[skew]["claimable_at_age_s"] >= backoff["configured_s"], backoff
    say(
        figures_line(
            "clock skew",
            {
                "faults": figures["faults_injected"],
                "skew_s": 600,
                "done": figures["completed"],
                "live_released": 0,
                "by_own_clock": figures["would_release_by_own_clock"],
                "backoff_claimable_s": backoff["+600"]["claimable_at_age_s"],
                "tasks_lost": 0,
                "duplicates": 0,
            },
        )
    )
