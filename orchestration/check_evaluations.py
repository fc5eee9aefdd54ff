"""What each asset check evaluates, over the whole corpus (the nightly checks job) or over the documents a roll-up
just wrote (after every roll-up that changed something).

A check is a `CheckSpec`: the asset it sits on, its name and description, the resources it opens, and its
`evaluate(resources, documents, page_size)` -> (passed, metadata). `documents` None reads everything, streamed
where the corpus can be large; a list of document ids reads those documents' rows only, through their primary key
and foreign-key indexes, so a roll-up's checks cost what its documents cost. orchestration.checks makes the
Dagster asset checks from these specs; each roll-up logs the evaluations of its phase's specs for its documents,
which the UI shows on the same checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import dagster as dg

from orchestration.verify import verify_documents, verify_stores
from queue_db.inspection import expansions_without_outcome, stale_counts
from queue_db.phases import TABLE_OF_LEVEL, Level, PhaseRegistry, PhaseSpec

Evaluation = tuple[bool, dict[str, Any]]
# stuck tasks a check counts at most per kind (the oldest entries of each kind's partial heartbeat index)
STUCK_LIMIT = 1000


@dataclass(frozen=True)
class CheckSpec:
    phase: PhaseSpec
    asset: str
    name: str
    description: str
    resources: frozenset[str]
    evaluate: Callable[[Any, list[str] | None, int], Evaluation]


def _no_task_stuck(resources, documents, page_size) -> Evaluation:
    # every kind's partial heartbeat index holds only the rows in processing: bounded whatever the scope
    queue = resources.database.get_queue()
    with queue.engine.connect() as conn:
        stuck = stale_counts(conn, queue.settings.stale_timeout_s, limit=STUCK_LIMIT)
    return sum(stuck.values()) == 0, stuck


def _parents_agree(phase: PhaseSpec):
    def evaluate(resources, documents, page_size) -> Evaluation:
        queue = resources.database.get_queue()
        # scoped to a roll-up's documents: only its phase's parents; the nightly run covers every phase
        disagreeing = queue.disagreeing_parents(documents, None if documents is None else [phase])
        return sum(disagreeing.values()) == 0, disagreeing

    return evaluate


def _expanded_or_failed(phase: PhaseSpec):
    kind, child = phase.kinds[0], phase.kinds[1]

    def evaluate(resources, documents, page_size) -> Evaluation:
        queue = resources.database.get_queue()
        found = expansions_without_outcome(queue.engine, kind, TABLE_OF_LEVEL[child.level], documents)
        return found["completed_without_children"] == 0 and found["failed_without_reason"] == 0, found

    return evaluate


def _vectors_agree(resources, documents, page_size) -> Evaluation:
    queue = resources.database.get_queue()
    embedder = resources.embeddings.get_embedder()
    store = resources.qdrant.get_store(embedder.model_id, embedder.dim)
    try:
        store.ensure_collection()
        if documents is None:
            report = verify_stores(queue, vector_store=store, page_size=page_size)
        else:
            report = verify_documents(queue, documents, vector_store=store)
    finally:
        store.close()
    missing = len(report.chunks_without_point)
    extra = len(report.points_without_chunk) + report.points_of_unfinished_chunks
    return missing == 0 and extra == 0, {
        "completed_chunks": report.completed_vector_chunks,
        "points": report.points,
        "missing_points": missing,
        "points_not_completed": extra,
    }


def _graph_agrees(resources, documents, page_size) -> Evaluation:
    queue = resources.database.get_queue()
    graph = resources.neo4j.get_store()
    try:
        if documents is None:
            report = verify_stores(queue, graph_store=graph, page_size=page_size)
        else:
            report = verify_documents(queue, documents, graph_store=graph)
    finally:
        graph.close()
    missing = len(report.chunks_without_graph)
    return missing == 0 and not report.chunks_short_of_mentions and not report.duplicate_entities, {
        "completed_chunks": report.completed_graph_chunks,
        "chunks_with_writes": report.completed_graph_chunks - missing,
        "missing": missing,
        "short_of_mentions": len(report.chunks_short_of_mentions),
        "duplicate_entities": len(report.duplicate_entities),
    }


# the store each phase handler writes, checked against the queue on the phase's deepest kind
STORE_CHECKS = {
    "vector": (
        "vectors_agree_with_queue",
        "Each completed vector chunk has exactly one Qdrant point and no point lacks a chunk (nightly: both streamed, "
        "DOCQUEUE_VERIFY_PAGE ids at a time; after a roll-up: its documents' chunks and points).",
        frozenset({"database", "embeddings", "qdrant"}),
        _vectors_agree,
    ),
    "graphrag": (
        "graph_agrees_with_queue",
        "Each completed GraphRAG chunk has its graph writes (nightly, and for a roll-up's documents); no duplicate "
        "entity nodes (nightly).",
        frozenset({"database", "neo4j"}),
        _graph_agrees,
    ),
}


def phase_check_specs(phases: PhaseRegistry, rollup_name: Callable[[PhaseSpec], str]) -> list[CheckSpec]:
    """Every check, on the assets of the phase specs: the queue's on the first phase (its document task when that
    expands documents into pages, its deepest kind, its roll-up `rollup_name(phase)`), each store's on the deepest
    kind of the phase whose handler writes that store."""
    first, database = phases.phases[0], frozenset({"database"})
    specs = []
    if len(first.kinds) > 1 and first.kinds[0].level is Level.DOCUMENT and first.kinds[1].level is Level.PAGE:
        specs.append(
            CheckSpec(
                first,
                first.kinds[0].name,
                "has_pages_or_stated_failure",
                "Every registered document whose task settled has pages, or failed with a stated reason.",
                database,
                _expanded_or_failed(first),
            )
        )
    specs += [
        CheckSpec(
            first,
            first.leaf.name,
            "no_task_stuck_in_processing",
            "No task of any kind is `processing` with a heartbeat older than the stale timeout.",
            database,
            _no_task_stuck,
        ),
        CheckSpec(
            first,
            rollup_name(first),
            "parents_agree_with_children",
            "Every page and document status equals the bubble-up rule over its children (after a roll-up: its "
            "documents' and their pages').",
            database,
            _parents_agree(first),
        ),
    ]
    for spec in phases:
        if spec.handler in STORE_CHECKS:
            name, description, resources, evaluate = STORE_CHECKS[spec.handler]
            specs.append(CheckSpec(spec, spec.leaf.name, name, description, resources, evaluate))
    return specs


def log_check_evaluations(context, specs: list[CheckSpec], document_ids: list[str]) -> None:
    """Evaluate `specs` for the documents a roll-up just wrote, and log each result on its check, as the check's
    own run would: the UI shows it on the asset's Checks tab. A check that cannot be evaluated (a store
    unreachable) is logged as not passed, with the one-sentence reason, rather than failing the roll-up."""
    for spec in specs:
        try:
            passed, metadata = spec.evaluate(context.resources, document_ids, 0)
        except Exception as exc:  # the roll-up is written; its check's outage is the check's result
            passed, metadata = False, {"error": f"{type(exc).__name__}: {exc}"[:500]}
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey(spec.asset),
                check_name=spec.name,
                passed=passed,
                metadata={**metadata, "documents_checked": len(document_ids), "scope": "a roll-up's documents"},
                description=f"after the {spec.phase.name} roll-up of {len(document_ids)} document(s)",
            )
        )
