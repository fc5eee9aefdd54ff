"""One task asset per task kind of every phase, made from the phase specs.

A kind's asset carries the kind's name, is partitioned by its level's dynamic partitions, belongs to its phase's
group, runs in the phase's pool and on its Celery queue, and depends on the kind before it in pipeline order
(partition to partition on the same level, on all of the parent's partitions across levels). Its body claims
the range's tasks and settles them through the phase handler's work (assets.common.materialize_range); a kind
whose tasks create the next level's rows (a document's pages, a page's chunks) registers their partitions
after its run. What the UI shows of each asset, its description and its kinds, is the table below.
"""

from dataclasses import dataclass
from typing import Mapping

import dagster as dg

from orchestration.assets.common import materialize_range, queue_of
from orchestration.assets.handlers import BASE_RESOURCES, HandledTasks, PhaseHandler, kind_work
from orchestration.cluster import celery_queue_tags
from orchestration.partitions import PARTITIONS_BY_LEVEL, register_partitions
from orchestration.pipeline import Pipeline
from orchestration.task_outcomes import PageLimits
from queue_db.phases import Level, PhaseRegistry, PhaseSpec, TaskKind

SINGLE_RUN = dg.BackfillPolicy.single_run()
OWNERS = ["team:docqueue"]


@dataclass(frozen=True)
class AssetText:
    description: str
    kinds: frozenset[str] = frozenset({"python"})


ASSET_TEXT: dict[str, AssetText] = {
    "ocr_document": AssetText(
        "Opens the PDF (password from its reference if any), checks the limits, counts its pages and "
        "creates one OCR task and one `pages` partition per page. Fails with a readable reason for "
        "corrupt, encrypted, empty or oversized files.",
        frozenset({"pymupdf", "postgres"}),
    ),
    "ocr_page": AssetText(
        "Converts one page to markdown: the text layer when the page has one (headings, lists and tables "
        "kept), RapidOCR when it has none; repeated headers/footers and page numbers removed. "
        "Metadata per page: method, characters, seconds.",
        frozenset({"pymupdf", "postgres"}),
    ),
    "vector_page": AssetText(
        "Chunks a page's markdown (headings, paragraphs, lists and tables respected; token budget with "
        "overlap; deterministic ids) and creates one vector task and one `chunks` partition per chunk.",
        frozenset({"python", "postgres"}),
    ),
    "vector_chunk": AssetText(
        "Embeds a chunk with all-MiniLM-L6-v2 (int8 ONNX, 384 dims) and upserts it into Qdrant; the point "
        "id is uuid5(chunk_id), so a retry overwrites instead of duplicating.",
        frozenset({"onnx", "qdrant"}),
    ),
    "graphrag_chunk": AssetText(
        "Extracts entities and relationships from a chunk (spaCy offline, or an OpenAI-compatible LLM) and "
        "MERGEs them into the graph: Document-Page-Chunk-MENTIONS-Entity, Entity-RELATED_TO-Entity. "
        "Re-running a chunk changes nothing.",
        frozenset({"spacy", "neo4j"}),
    ),
}


def asset_text(kind: TaskKind) -> AssetText:
    """The kind's description and kinds; a kind without an entry is described from its spec."""
    return ASSET_TEXT.get(kind.name) or AssetText(
        f"Processes one {kind.level.value} of the {kind.phase.name} phase (handler `{kind.phase.handler}`); "
        "one task per partition."
    )


def _deps(kind: TaskKind, previous: TaskKind | None) -> list:
    if previous is None:
        return []
    if previous.level is kind.level:
        return [previous.name]
    return [dg.AssetDep(previous.name, partition_mapping=dg.AllPartitionMapping())]


def _children_level(spec: PhaseSpec, kind: TaskKind) -> Level | None:
    """The level whose rows `kind`'s tasks create: the next kind of its phase, when that one lies deeper."""
    index = spec.kinds.index(kind)
    following = spec.kinds[index + 1] if index + 1 < len(spec.kinds) else None
    return following.level if following is not None and following.level is not kind.level else None


def task_asset(
    phases: PhaseRegistry,
    spec: PhaseSpec,
    kind: TaskKind,
    previous: TaskKind | None,
    handlers: Mapping[str, PhaseHandler],
    limits: PageLimits,
) -> dg.AssetsDefinition:
    work = kind_work(handlers, spec, kind)
    text = asset_text(kind)
    creates = _children_level(spec, kind)

    @dg.asset(
        name=kind.name,
        group_name=spec.name,
        partitions_def=PARTITIONS_BY_LEVEL[kind.level],
        backfill_policy=SINGLE_RUN,
        output_required=False,
        kinds=set(text.kinds),
        owners=OWNERS,
        tags={"docqueue/phase": spec.name},
        pool=spec.pool,
        op_tags=celery_queue_tags(spec.celery_queue),
        deps=_deps(kind, previous),
        description=text.description,
        required_resource_keys={*BASE_RESOURCES, *work.resources},
    )
    def task(context: dg.AssetExecutionContext):
        resources = context.resources
        pipeline = Pipeline.from_resources(
            queue_of(resources.database, phases),
            resources.storage,
            limits=limits,
            **{name: getattr(resources, name) for name in work.resources},
        )
        after = None
        if creates is not None:

            def after(report):
                register_partitions(context.instance, pipeline.queue.engine, creates)

        try:
            yield from materialize_range(context, kind, pipeline.queue, HandledTasks(pipeline, work), after=after)
        finally:
            if work.closes_pipeline:
                pipeline.close()

    return task


def task_assets(
    phases: PhaseRegistry, handlers: Mapping[str, PhaseHandler], limits: PageLimits = PageLimits()
) -> list[dg.AssetsDefinition]:
    """Every kind's asset, in pipeline order."""
    assets, previous = [], None
    for spec in phases:
        for kind in spec.kinds:
            assets.append(task_asset(phases, spec, kind, previous, handlers, limits))
            previous = kind
    return assets
