"""Run sizing from measured costs (queue_db.run_costs.sized_keys): pure arithmetic, no database."""

from __future__ import annotations

import pytest

from queue_db.run_costs import LEAST_OVERHEAD_S, RunCost, seconds_before_work, sized_keys


def test_without_a_measured_run_or_with_sizing_off_runs_hold_their_maximum():
    assert sized_keys(None, max_keys=100, overhead_share=0.05) == 100
    assert sized_keys(RunCost(0.01, 0.5), max_keys=100, overhead_share=0.0) == 100
    assert sized_keys(RunCost(0.0, 0.5), max_keys=100, overhead_share=0.05) == 100


def test_a_run_holds_enough_keys_that_its_fixed_cost_is_the_share_of_its_work():
    # 0.5 s before the work, 2 s a key (OCR of a scan): 0.5 / (0.05 x 2) = 5 keys, whose work is 10 s
    assert sized_keys(RunCost(2.0, 0.5), max_keys=100, overhead_share=0.05) == 5
    # 20 ms a key: 500 keys wanted, the setting's maximum bounds what one failed run retries
    assert sized_keys(RunCost(0.02, 0.5), max_keys=200, overhead_share=0.05) == 200
    assert sized_keys(RunCost(0.02, 0.5), max_keys=1000, overhead_share=0.05) == 500
    # a run measured at less than the least fixed cost is sized for the least (what the measure leaves out)
    assert sized_keys(RunCost(1.0, 0.0), max_keys=100, overhead_share=0.05) == round(LEAST_OVERHEAD_S / 0.05)
    assert sized_keys(RunCost(100.0, 0.0), max_keys=100, overhead_share=0.05) == 1


@pytest.mark.parametrize(
    ("ready", "slots", "expected"),
    [
        (2000, 4, 500),  # enough for every slot: full-size runs
        (400, 4, 100),  # fewer than 4 full runs: spread over the 4 slots
        (40, 4, 25),  # spreading stops where a run's work would fall under its fixed cost (0.5 / 0.02 = 25 keys)
        (400, 1, 500),  # one slot: nothing to spread over
    ],
)
def test_little_ready_work_is_spread_over_the_slots_while_each_run_outweighs_its_fixed_cost(ready, slots, expected):
    assert sized_keys(RunCost(0.02, 0.5), max_keys=1000, overhead_share=0.05, ready=ready, slots=slots) == expected


def test_before_a_measured_run_little_ready_work_is_still_spread_over_the_slots():
    # 48 scanned pages ready, four runs may go at once: four runs of 12, not one run of 48 on one worker
    assert sized_keys(None, max_keys=100, overhead_share=0.05, ready=48, slots=4) == 12
    assert sized_keys(None, max_keys=100, overhead_share=0.05, ready=1000, slots=4) == 100
    assert sized_keys(None, max_keys=100, overhead_share=0.0, ready=48, slots=4) == 100  # sizing off


def test_a_steps_wait_on_the_broker_is_not_its_runs_fixed_cost():
    assert seconds_before_work(began=110.0, run_started=100.0) == 10.0
    # handed to a Celery worker at 109.5, after 9.5 s behind other runs' steps: 0.5 s of fixed cost
    assert seconds_before_work(began=110.0, run_started=100.0, handed=109.5) == 0.5
    # a worker's clock behind the run's: never before the run's start, never negative
    assert seconds_before_work(began=110.0, run_started=100.0, handed=99.0) == 10.0
    assert seconds_before_work(began=99.0, run_started=100.0) == 0.0
