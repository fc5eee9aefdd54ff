"""The fault matrix's database rows (bench/faults.py rows 1-3) at a tiny size, on a PostgreSQL of their own: a
fleet of queue workers and the code location's sensors meet killed backends, a server with every connection slot
taken, and a snapshot held open. Nothing may be lost, nothing completed twice, no roll-up left wrong, and nothing
may end in a traceback; the figures of the full rows are in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from tests.reliability.support import figures_line


@pytest.fixture(scope="module")
def bench():
    from bench import faults

    args = faults.parse_args(
        ["--quick", "--no-clean", "--tasks", "6000", "--max-connections", "30", "--kills", "10", "--hold-s", "3"]
    )
    # --quick sets its own; these are the test's (autovacuum is not waited for: the bench measures that)
    args.kills, args.hold_s, args.vacuum_timeout_s, args.window = 10, 3.0, 0.0, 1.0
    handle = faults.Bench(args)
    try:
        yield handle
    finally:
        handle.close()


def _sound(figures: dict) -> None:
    assert figures["tasks_lost"] == 0, figures
    assert figures["completed_twice"] == 0, figures
    assert figures["rollup_mismatches"] == 0 and figures["reconcile_corrections"] == 0, figures
    assert figures["errors"] == [], figures["errors"]
    assert figures["completed"] > 0


def test_killed_backends_lose_nothing_and_the_sensors_keep_ticking(bench, say):
    from bench.faults import backend_kills

    figures = backend_kills(bench)
    _sound(figures)
    assert figures["faults_injected"] == 10, figures
    # every moment was caught at least once: mid-claim, mid-completion, mid-bubble-up, mid-heartbeat, a sensor's
    assert all(n >= 1 for n in figures["by_moment"].values()), figures["by_moment"]
    assert figures["unrecovered_victims"] == 0, figures
    assert figures["sensor_ticks_after_last_kill"] > 0, figures
    say(
        figures_line(
            "backends killed",
            {
                "faults": figures["faults_injected"],
                "recovery_s_max": figures["recovery_s_max"],
                "tasks_lost": 0,
                "duplicates": 0,
                "done": figures["completed"],
            },
        )
    )


def test_a_full_server_is_waited_out_by_workers_sensors_and_the_cli(bench, say):
    from bench.faults import connections_exhausted

    figures = connections_exhausted(bench)
    _sound(figures)
    assert figures["slots_held"] >= 25, figures  # the holder took every slot the fleet left
    assert figures["worker_wait_lines"] > 0, figures  # the workers met the full server and waited
    assert figures["tracebacks_in_worker_logs"] == 0, figures
    cli = figures["cli"]
    assert cli["exit_code"] == 0 and not cli["traceback"], cli
    assert any("no free connection" in line for line in cli["stderr_lines"]), cli
    # work goes on once the slots are free (a waiting worker looks again within 2 s, its retry pause)
    assert figures["sensor_ticks_after"] > 0 and figures["completed_after_release"] > 0, figures
    say(
        figures_line(
            "connections exhausted",
            {
                "faults": 1,
                "slots_held": figures["slots_held"],
                "cli_s": cli["seconds"],
                "tasks_lost": 0,
                "duplicates": 0,
            },
        )
    )


def test_a_snapshot_held_open_keeps_dead_tuples_until_released(bench, say):
    from bench.faults import idle_in_transaction

    figures = idle_in_transaction(bench)
    _sound(figures)
    assert figures["tasks_under_snapshot"] >= 1000, figures
    # the held snapshot keeps every dead row version of the run; the clean run's are vacuumable
    assert figures["dead_tuples"]["held"] > 0, figures
    say(
        figures_line(
            "idle in transaction",
            {
                "faults": 1,
                "dead_tuples": figures["dead_tuples"]["held"],
                "drop": figures["throughput_drop"],
                "tasks_lost": 0,
                "duplicates": 0,
            },
        )
    )


def test_workers_sigkilled_again_and_again_leave_every_task_completed_once(bench, say):
    from bench.faults import fleet_kills

    bench.args.sigkills, bench.args.sigkill_gap_s, bench.args.drain_timeout_s = 10, 0.15, 60.0
    figures = fleet_kills(bench)  # the row's half on documents is test_repeated_kills.py
    _sound(figures)
    assert figures["faults_injected"] == 10, figures
    assert figures["unfinished"] == 0, figures  # the queue ran dry: every task completed, none failed
    say(
        figures_line(
            "workers sigkilled",
            {
                "faults": figures["faults_injected"],
                "tasks_recovered": figures["released_during_run"],
                "tasks_lost": 0,
                "duplicates": 0,
                "done": figures["completed"],
            },
        )
    )
