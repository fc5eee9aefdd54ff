"""Which runs to launch: ready tasks, grouped into partition ranges. Shared by the sensors and `docqueue run`.

A planned run covers consecutive positions of one registration block (so it is one Dagster partition range), holds
at most `max_keys` keys, and skips tasks already covered by a queued or running run of the same kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
import sqlalchemy as sa

from queue_db.partition_keys import (
    BlockShare,
    Candidate,
    RollupBacklog,
    ready_candidates,
    rollup_backlog,
    rollup_candidates,
)
from queue_db.phases import PHASES, PhaseRegistry, PhaseSpec, TaskKind
from queue_db.run_costs import RunCost, least_keys, sized_keys

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
KIND_TAG, PHASE_TAG = "docqueue/kind", "docqueue/phase"
# where a run's range lies in the partition registration: `block:start-end` (what planning reads back to skip ranges
# in flight; a person reads the range start and end keys instead)
SPAN_TAG = "docqueue/span"
# what a person reads: the range as "first key … last key (N documents)"
RANGE_TAG = "docqueue/range"


def range_text(first: str, last: str, size: int, unit: str) -> str:
    """A run's range as a person reads it: "wild-1a2b … wild-9f8e (42 documents)", or "wild-1a2b (1 document)"."""
    counted = f"{size} {unit}{'' if size == 1 else 's'}"
    return f"{first} ({counted})" if first == last else f"{first} … {last} ({counted})"


def parse_span(tags: dict) -> tuple[int, int, int] | None:
    """(block, start, end) from a run's tags; None when it has none or it is malformed."""
    try:
        block, positions = tags[SPAN_TAG].split(":")
        start, end = positions.split("-")
        return int(block), int(start), int(end)
    except (KeyError, ValueError):
        return None


IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


# documents whose repeated, already recorded failure one planning round marks rolled up without a run
# (queue_db.partition_keys.settle_known_failures, read through the roll-up index)
SETTLE_LIMIT = 1000


@dataclass(frozen=True)
class PlannedRun:
    name: str  # a task kind's name, or "rollup_<phase>"
    phase: str
    block: int
    start_pos: int
    end_pos: int
    start_key: str
    end_key: str
    size: int
    retries: int
    unit: str = "document"  # the level of its partitions, as the range tag counts them

    @property
    def tags(self) -> dict[str, str]:
        return {
            RANGE_START_TAG: self.start_key,
            RANGE_END_TAG: self.end_key,
            KIND_TAG: self.name,
            PHASE_TAG: self.phase,
            SPAN_TAG: f"{self.block}:{self.start_pos}-{self.end_pos}",
            RANGE_TAG: range_text(self.start_key, self.end_key, self.size, self.unit),
        }

    @property
    def run_key(self) -> str:
        # retries change after every failed or lost attempt, so a retry is a new run key
        return f"{self.name}:{self.block}:{self.start_pos}-{self.end_pos}:r{self.retries}"


# a kind's (or roll-up's) runs in flight: registration block -> the position ranges they cover
Positions = dict[int, list[tuple[int, int]]]


def in_flight_positions(instance: dg.DagsterInstance, name: str) -> Positions:
    """Blocks and position ranges of runs named `name` (a kind or a roll-up) that are queued or running."""
    return in_flight_by_name(instance, [name]).get(name, {})


def in_flight_by_name(instance: dg.DagsterInstance, names: Sequence[str]) -> dict[str, Positions]:
    """in_flight_positions of each of `names`, from one read of the run storage (a name without runs in flight is
    absent)."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES, tags={KIND_TAG: list(names)}))
    by_name: dict[str, Positions] = {}
    for run in runs:
        span = parse_span(run.tags)
        if span is None:
            continue
        block, start, end = span
        by_name.setdefault(run.tags[KIND_TAG], {}).setdefault(block, []).append((start, end))
    return by_name


def candidate_limit(max_runs: int, max_keys: int, in_flight: dict[int, list[tuple[int, int]]] | None) -> int:
    """Ready tasks a planning round reads: enough for `max_runs` full runs, plus the tasks that ranges in flight may
    still cover (read, then skipped). Reading more than this cannot change which runs are planned first."""
    covered = sum(end - start + 1 for ranges in (in_flight or {}).values() for start, end in ranges)
    return max_runs * max_keys + covered


@dataclass(frozen=True)
class RunSizing:
    """How the runs of a kind are sized: its measured cost (queue_db.run_costs; None before its first run), the
    share of a run's work its fixed cost may be (DOCQUEUE_RUN_OVERHEAD_SHARE) and the runs of the kind that may go
    at once (`slots`: its pool's limit under the daemon, 1 for a `docqueue run` runner, which runs one at a time)."""

    cost: RunCost | None = None
    overhead_share: float = 0.0
    slots: int = 1

    def keys(self, max_keys: int, ready: int | None = None, slots: int | None = None) -> int:
        return sized_keys(
            self.cost,
            max_keys=max_keys,
            overhead_share=self.overhead_share,
            ready=ready,
            slots=self.slots if slots is None else slots,
        )


def pool_slots(instance: dg.DagsterInstance, pool: str | None) -> int:
    """Runs of a pool that may go at once: the pool's limit (its own, or the instance's default for pools), and at
    most the run queue's `max_concurrent_runs`. 1 when the instance cannot tell."""
    try:
        runs = instance.get_concurrency_config().run_queue_config
        limit = runs.max_concurrent_runs if runs and runs.max_concurrent_runs > 0 else None
        if pool:
            info = instance.event_log_storage.get_concurrency_info(pool)
            pool_limit = info.limit if info.limit is not None else info.slot_count
            limit = pool_limit if limit is None else min(limit, pool_limit)
        return max(1, int(limit or 1))
    except Exception:  # noqa: BLE001  (an instance without concurrency support plans as if one run went at once)
        return 1


def plan_runs(
    engine: sa.Engine,
    kind: TaskKind,
    *,
    max_keys: int,
    in_flight: dict[int, list[tuple[int, int]]] | None = None,
    max_runs: int = 25,
    share: BlockShare | None = None,
    documents=None,
    sizing: RunSizing | None = None,
) -> list[PlannedRun]:
    """Group the ready tasks of `kind` into runs over consecutive positions, most urgent first; `max_keys` is
    `DagsterConfig.max_keys_per_run` of the settings, and `sizing` (its measured cost) may make runs smaller
    (queue_db.run_costs). When what is ready would fill fewer runs than the free slots, it is spread over them."""
    sizing = sizing or RunSizing()
    keys = sizing.keys(max_keys)
    # measured, a block is cut into shares that each pay for a run: split unmeasured at a quarter of 1,000 chunk keys,
    # the 474 and 166 chunks of 320 text pages went whole to one runner each
    least = least_keys(sizing.cost) if sizing.cost is not None else None
    share = share.for_runs_of(keys, least) if share else None
    candidates = ready_candidates(engine, kind, candidate_limit(max_runs, keys, in_flight), documents, share)
    if sizing.slots > 1 and sizing.overhead_share > 0:
        busy = sum(len(ranges) for ranges in (in_flight or {}).values())
        ready = sum(1 for c in candidates if not _covered(c, in_flight or {}))
        keys = sizing.keys(max_keys, ready=ready, slots=max(1, sizing.slots - busy))
    return group_into_runs(
        candidates, kind.name, kind.phase.name, max_keys=keys, in_flight=in_flight, max_runs=max_runs
    )


def plan_help_run(
    engine: sa.Engine,
    kind: TaskKind,
    in_flight: dict[int, list[tuple[int, int]]],
    *,
    max_keys: int,
    least: int,
    documents=None,
) -> PlannedRun | None:
    """For a runner of `run --workers N` with nothing of its own to run: a run over the second half of the tasks
    still unclaimed in the sibling's run of `kind` in flight (`in_flight`: the kind's ranges) that has the most of
    them, so that the runners' work ends together instead of one runner idling while the other finishes a share
    larger than its own. None when no such half holds `least` keys (the fewest worth a run: run_costs.least_keys).

    The two runs claim the range's tasks a batch at a time, as the queue hands them out (FOR UPDATE SKIP LOCKED),
    so no task runs twice; the sibling's run ends once none is left for it, and each key is materialized by the
    run that processed it (the other reports it taken elsewhere)."""
    if not in_flight:
        return None
    candidates = ready_candidates(engine, kind, candidate_limit(1, max_keys, in_flight), documents)
    by_range: dict[tuple[int, int, int], list[Candidate]] = {}
    for candidate in candidates:
        for start, end in in_flight.get(candidate.block, ()):
            if start <= candidate.pos <= end:
                by_range.setdefault((candidate.block, start, end), []).append(candidate)
                break
    if not by_range:
        return None
    (block, _, _), members = max(by_range.items(), key=lambda item: len(item[1]))
    members.sort(key=lambda c: c.pos)
    half = members[len(members) // 2 :][-max_keys:]
    if len(half) < max(1, least) or len(members) < 2:
        return None
    first, last = half[0], half[-1]
    return PlannedRun(
        kind.name,
        kind.phase.name,
        block,
        first.pos,
        last.pos,
        first.key,
        last.key,
        last.pos - first.pos + 1,
        sum(c.retries for c in half),
        first.level.value,
    )


def plan_rollup_runs(
    engine: sa.Engine,
    phase: PhaseSpec,
    *,
    phases: PhaseRegistry = PHASES,
    in_flight=None,
    max_keys: int = 200,
    max_runs: int = 10,
    share: BlockShare | None = None,
    documents=None,
    phase_busy: bool = False,
    hold_s: float = 0.0,
) -> list[PlannedRun]:
    """Group the documents whose `phase` (of `phases`) reached a final status into roll-up runs. `phase_busy`: runs
    of the phase's own kinds are in flight or planned beside these, so the roll-ups may wait `hold_s` (rollups_wait)."""
    share = share.for_runs_of(max_keys) if share else None
    if phase_busy and hold_s > 0:
        backlog = rollup_backlog(engine, phase, max_keys, documents, share, phases=phases)
        if rollups_wait(backlog, hold_s=hold_s, max_keys=max_keys):
            return []
    candidates = rollup_candidates(
        engine, phase, candidate_limit(max_runs, max_keys, in_flight), documents, share, phases=phases
    )
    return group_into_runs(
        candidates, f"rollup_{phase.name}", phase.name, max_keys=max_keys, in_flight=in_flight, max_runs=max_runs
    )


def rollups_wait(backlog: RollupBacklog, *, hold_s: float, max_keys: int) -> bool:
    """Whether a busy phase's roll-ups wait for more documents. A roll-up run costs what any run costs and does
    almost no work, and while the phase's own runs go on its documents finish one run at a time: written at once,
    each would be a run of its own. They wait until a full run's worth is due or the longest-waiting document has
    waited `hold_s` (DOCQUEUE_ROLLUP_HOLD_S), which bounds how late a partition shows its phase's outcome."""
    return 0 < backlog.documents < max_keys and backlog.oldest_wait_s < hold_s


def group_into_runs(
    candidates: list[Candidate],
    name: str,
    phase: str,
    *,
    max_keys: int,
    in_flight: dict[int, list[tuple[int, int]]] | None = None,
    max_runs: int = 25,
) -> list[PlannedRun]:
    in_flight = in_flight or {}
    candidates = [c for c in candidates if not _covered(c, in_flight)]
    urgency = {c.id: i for i, c in enumerate(candidates)}  # claim order: priority, failed first, oldest
    by_block: dict[int, list[Candidate]] = {}
    for candidate in candidates:
        by_block.setdefault(candidate.block, []).append(candidate)
    runs: list[tuple[int, PlannedRun]] = []
    for block, members in by_block.items():
        members.sort(key=lambda c: c.pos)
        group: list[Candidate] = []
        for candidate in members:
            if group and (candidate.pos != group[-1].pos + 1 or len(group) >= max_keys):
                runs.append(_as_run(name, phase, block, group, urgency))
                group = []
            group.append(candidate)
        if group:
            runs.append(_as_run(name, phase, block, group, urgency))
    runs.sort(key=lambda pair: pair[0])
    return [run for _, run in runs[:max_runs]]


def _covered(candidate: Candidate, in_flight: dict[int, list[tuple[int, int]]]) -> bool:
    return any(start <= candidate.pos <= end for start, end in in_flight.get(candidate.block, ()))


def _as_run(
    name: str, phase: str, block: int, group: list[Candidate], urgency: dict[str, int]
) -> tuple[int, PlannedRun]:
    return (
        min(urgency[c.id] for c in group),
        PlannedRun(
            name,
            phase,
            block,
            group[0].pos,
            group[-1].pos,
            group[0].key,
            group[-1].key,
            len(group),
            sum(c.retries for c in group),
            group[0].level.value,
        ),
    )
