"""Run sizing from measured costs (queue_db.run_costs.sized_keys): pure arithmetic, no database."""

from __future__ import annotations

import pytest

from queue_db.run_costs import LEAST_OVERHEAD_S, RunCost, sized_keys


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
