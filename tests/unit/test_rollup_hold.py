"""When a busy phase's roll-ups wait for more documents (orchestration.planning.rollups_wait)."""

from orchestration.planning import rollups_wait
from queue_db.partition_keys import RollupBacklog


def test_rollups_wait_below_a_full_run_until_the_oldest_waited_the_hold():
    assert rollups_wait(RollupBacklog(3, 2.0), hold_s=15, max_keys=200)
    assert not rollups_wait(RollupBacklog(3, 15.0), hold_s=15, max_keys=200)  # the oldest waited the hold out
    assert not rollups_wait(RollupBacklog(200, 0.0), hold_s=15, max_keys=200)  # a full run's worth is due
    assert not rollups_wait(RollupBacklog(0, 0.0), hold_s=15, max_keys=200)  # nothing is due
