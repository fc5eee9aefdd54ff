"""The one table from a phase spec's handler name to the code that does its work, level by level.

A phase's spec names its handler (queue_db.phases.PhaseSpec.handler); the handler says, for each level the
phase has a task kind at, which `Pipeline` function processes that kind's claimed tasks and which Dagster
resources it opens beside the queue's database and the storage. A phase is added by adding its spec and one
entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from orchestration.pipeline import Pipeline
from orchestration.task_outcomes import Outcome
from queue_db.phases import Level, PhaseSpec, TaskKind

# the resources every task asset opens: the queue, and the storage its pipeline reads and writes
BASE_RESOURCES = ("database", "storage")


@dataclass(frozen=True)
class KindWork:
    """How a kind's claimed tasks are processed: `run(pipeline, worker_id, tasks)` settles each task through the
    queue and returns one Outcome per task (orchestration.pipeline's contract)."""

    run: Callable[[Pipeline, str, Sequence[dict]], list[Outcome]]
    # Dagster resources besides BASE_RESOURCES, by resource key (they are the Pipeline's keyword arguments)
    resources: tuple[str, ...] = ()
    # the run closes the pipeline's clients when done (the vector store it opened for the run)
    closes_pipeline: bool = False


# a phase's handler: its work at each level it has a task kind at
PhaseHandler = Mapping[Level, KindWork]


def pipeline_method(name: str) -> Callable[[Pipeline, str, Sequence[dict]], list[Outcome]]:
    """The Pipeline method `name`, looked up on each call rather than bound here: a subclass's override, or a fault
    test's patched method, is the one that runs."""

    def run(pipeline: Pipeline, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        return getattr(pipeline, name)(worker_id, tasks)

    run.__name__ = run.__qualname__ = name
    return run


HANDLERS: dict[str, PhaseHandler] = {
    "ocr": {
        Level.DOCUMENT: KindWork(pipeline_method("expand_documents"), ("ocr",)),
        Level.PAGE: KindWork(pipeline_method("ocr_pages"), ("ocr",)),
    },
    "vector": {
        Level.PAGE: KindWork(pipeline_method("chunk_pages")),
        Level.CHUNK: KindWork(pipeline_method("embed_chunks"), ("embeddings", "qdrant"), closes_pipeline=True),
    },
    "graphrag": {Level.CHUNK: KindWork(pipeline_method("extract_chunks"), ("neo4j", "extraction"))},
}


class HandlerError(LookupError):
    """A phase spec names a handler, or has a kind at a level, that the handler table does not cover."""


def kind_work(handlers: Mapping[str, PhaseHandler], spec: PhaseSpec, kind: TaskKind) -> KindWork:
    try:
        return handlers[spec.handler][kind.level]
    except KeyError:
        raise HandlerError(
            f"phase {spec.name!r} names handler {spec.handler!r}, which has no work for its "
            f"{kind.level.value}-level kind {kind.name!r}; known handlers: {', '.join(handlers)}"
        ) from None


class HandledTasks:
    """A pipeline and one kind's work, as assets.common.process_keys calls it (`process(kind, worker_id, tasks)`)."""

    def __init__(self, pipeline: Pipeline, work: KindWork):
        self.pipeline, self.work = pipeline, work

    def process(self, kind: TaskKind, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        return self.work.run(self.pipeline, worker_id, tasks)


def process_tasks(
    pipeline: Pipeline,
    kind: TaskKind,
    worker_id: str,
    tasks: Sequence[dict],
    *,
    handlers: Mapping[str, PhaseHandler] = HANDLERS,
) -> list[Outcome]:
    """Process one kind's claimed tasks outside Dagster (tests, benches, the plain loop): the same work the kind's
    asset runs, found through its phase's handler."""
    return handled_tasks(pipeline, kind, handlers=handlers).process(kind, worker_id, tasks)


def handled_tasks(
    pipeline: Pipeline, kind: TaskKind, *, handlers: Mapping[str, PhaseHandler] = HANDLERS
) -> HandledTasks:
    """The pipeline's work for `kind`, as assets.common.process_keys takes it (tests and benches that drive a
    range of keys without Dagster)."""
    return HandledTasks(pipeline, kind_work(handlers, kind.phase, kind))
