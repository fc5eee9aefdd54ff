"""The main job: make the sample set, ingest it, process it end to end through Dagster, and summarise."""

from __future__ import annotations

import time

from orchestration.code_location import build_definitions
from orchestration.environment import dagster_instance, prepare_environment
from orchestration.intake import IntakeRules, ingest_paths
from orchestration.partitions import register_partitions
from orchestration.runner import run_until_idle
from orchestration.samples import write_samples
from orchestration.stores import open_embedder, opened_stores
from queue_db.config import QueueSettings, Settings
from queue_db.migrate import upgrade
from queue_db.phases import PHASES, Level
from resources.database import get_queue, shared_engine
from resources.storage_resource import StorageResource

DEMO_QUERY = "How many containers did the harbour handle?"


def run_demo(settings: Settings) -> dict:
    started = time.monotonic()
    prepared = prepare_environment(settings)
    upgrade(shared_engine(prepared.queue_url))
    queue = get_queue(QueueSettings.from_config(settings.queue), prepared.queue_url)
    samples = write_samples(settings.database.home_path() / "samples")
    ingested = ingest_paths(
        queue, StorageResource.from_settings(settings).get_storage(), samples, rules=IntakeRules.from_settings(settings)
    )
    instance = dagster_instance(settings)
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    report = run_until_idle(
        build_definitions(settings), instance, queue, settings=settings, until_idle=True, max_seconds=1800
    )
    summary = summarise(queue, [r.document_id for r in ingested if r.document_id], settings)
    summary.update(
        {
            "runs": report.runs,
            "failed_runs": report.failed_runs,
            "ingested": [r.as_dict() for r in ingested],
            "seconds": round(time.monotonic() - started, 1),
        }
    )
    return summary


def summarise(queue, document_ids: list[str], settings: Settings) -> dict:
    # one column per phase of the registry; a phase waiting on a task that failed for good shows as blocked (its
    # stored status stays pending)
    names = [phase.value for phase in PHASES]
    shown = ", ".join(
        f"CASE WHEN {PHASES.blocked_phase_sql(phase)} THEN 'blocked' ELSE d.{phase.document_status_column}::text END"
        f" AS {phase.value}"
        for phase in PHASES
    )
    with queue.engine.connect() as conn:
        docs = [
            dict(r)
            for r in conn.exec_driver_sql(
                f"""SELECT d.id::text AS id, d.filename, {shown}, d.ocr_error
                FROM documents d WHERE d.id = ANY(%(ids)s::uuid[]) ORDER BY d.filename""",
                {"ids": document_ids},
            ).mappings()
        ]
        chunks = conn.exec_driver_sql(
            "SELECT count(*) FROM task_queue_chunk WHERE document_id = ANY(%(ids)s::uuid[])", {"ids": document_ids}
        ).scalar()
    phases = {
        phase: {
            "completed": sum(d[phase] == "completed" for d in docs),
            "failed": sum(d[phase] == "failed" for d in docs),
            "blocked": sum(d[phase] == "blocked" for d in docs),
            "open": sum(d[phase] in ("pending", "processing") for d in docs),
        }
        for phase in names
    }
    first = names[0]
    broken = [{"filename": d["filename"], "error": d["ocr_error"]} for d in docs if d[first] == "failed"]
    good = [d for d in docs if d[first] != "failed"]
    with opened_stores(settings) as (store, graph):
        vectors = store.count()
        counts = graph.counts()
        embedder = open_embedder(settings.embedding)
        hits = store.search(embedder.embed_one(DEMO_QUERY), limit=3, text=DEMO_QUERY)
    return {
        "documents": docs,
        "phases": phases,
        "chunks": int(chunks),
        "vectors": int(vectors),
        "entities": int(counts.get("entities", 0)),
        "relationships": int(counts.get("relationships", 0)),
        "broken": broken,
        "good_documents": len(good),
        "good_documents_completed": sum(all(d[p] == "completed" for p in names) for d in good),
        "search": {
            "query": DEMO_QUERY,
            "hits": [
                {
                    "score": round(h.score, 4),
                    "document": h.payload.get("filename"),
                    "page": h.payload.get("page_number"),
                    "text": h.payload.get("text", ""),
                }
                for h in hits
            ],
        },
    }
