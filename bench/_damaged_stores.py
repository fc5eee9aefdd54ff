"""Row 6 of bench/faults.py, a damaged vector store: the pipeline itself, driven through the `docqueue` commands as a
person would.

A generated corpus is ingested in two halves on a home and databases of its own; `docqueue run --until-idle` takes
the first half through every phase (the clean run, whose chunk completions per second are the reference), its
points move to the main shard (what the nightly job's index build does), then the second half runs, its points in
the tail. Twice, with nothing running: a segment file of the main shard is cut to nothing, then one of the tail's
is deleted. Each time `docqueue verify` must name that shard in one sentence with exit code 3 (time to detect),
`docqueue repair --vectors` sets it aside and re-queues its chunks, a second repair must change nothing, and
`docqueue run --until-idle` rebuilds them (time to rebuild, and its chunk completions per second against the clean
run's). Then the counts: tasks lost (not completed), points against chunks and distinct chunk ids, duplicate graph
nodes and edges, the graph's node and edge counts against those before the damage, and `docqueue verify` clean.

Not a bench of its own (its name starts with an underscore): `faults.py --rows 6` runs it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench._pipeline_env import (
    child_figures,
    damage_row,
    docqueue_env,
    migrated_queue,
    unfinished_and_chunks,
    verified_clean,
)
from bench._pipeline_env import docqueue as _docqueue

# (name, the shard, the segment file, what is done to it): the engine refuses to read the vectors of a shard whose
# vector file is cut, and to open one whose payload page is gone
DAMAGES = (
    ("truncated", "main", "vector_storage/vectors/chunk_0.mmap", "truncate"),
    ("deleted", "tail", "payload_storage/page_0.dat", "delete"),
)
CHUNK_COMPLETIONS_SQL = (
    "SELECT (SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'completed') + "
    "(SELECT count(*) FROM task_queue_chunk WHERE graphrag_status = 'completed')"
)


def row(args, services: tuple, root: Path) -> dict:
    """Row 6's figures (faults.py's keys: faults_injected, work_done, tasks_lost, completed_twice, errors, ...)."""
    import psycopg

    from bench.orchestration_overhead import clean_graph, make_corpus

    bolt, databases = services
    queue_url = migrated_queue(databases, "damaged_queue")
    clean_graph(bolt)
    env = docqueue_env(root / "home-damaged", queue_url, databases.create("damaged_dagster"), bolt)
    halves = [root / "corpus-damaged-1", root / "corpus-damaged-2"]
    for half in halves:
        make_corpus(half, max(1, args.damaged_documents // 2), args.damaged_pages)
    with psycopg.connect(queue_url, autocommit=True) as conn:
        _docqueue(env, "ingest", str(halves[0]))
        started = time.monotonic()
        _docqueue(env, "run", "--until-idle")
        clean_s = time.monotonic() - started
        clean_done = conn.execute(CHUNK_COMPLETIONS_SQL).fetchone()[0]
        _child(env, "index")
        _docqueue(env, "ingest", str(halves[1]))
        _docqueue(env, "run", "--until-idle")
        before = _child(env, "count")
        faults = {name: _damage_and_rebuild(env, conn, name, side, file, how) for name, side, file, how in DAMAGES}
        after = _child(env, "count")
        lost, chunks = unfinished_and_chunks(conn)
    return damage_row(
        faults,
        [("points and chunks differ", not (after["points"] == after["chunk_ids"] == chunks))],
        lost=lost,
        consistent=verified_clean(env),
        chunks=chunks,
        before=before,
        after=after,
        completed_twice=after["points"] - chunks,
        corpus={"documents": 2 * max(1, args.damaged_documents // 2), "pages": args.damaged_pages},
        clean=("clean_chunk_completions_per_s", round(clean_done / clean_s, 2)),
    )


def _damage_and_rebuild(env: dict, conn, name: str, side: str, file: str, how: str) -> dict:
    folder = Path(_child(env, "folders")[side])
    segment = next(p / file for p in sorted((folder / "segments").iterdir()) if (p / file).is_file())
    if how == "truncate":
        os.truncate(segment, 0)
    else:
        segment.unlink()
    problems = []
    started = time.monotonic()
    verify = _docqueue(env, "verify", "--json", check=False)
    detect_s = time.monotonic() - started
    said = verify.stderr.strip()
    if verify.returncode != 3 or not said.startswith(f"docqueue: the vector store's shard {folder} is damaged ("):
        problems.append(f"verify did not name the shard: exit {verify.returncode}, {said[-300:]}")
    if "\n" in said or "Traceback" in said:
        problems.append("verify said more than one sentence")
    started = time.monotonic()
    repaired = json.loads(_docqueue(env, "repair", "--vectors", "--json").stdout)
    repair_s = time.monotonic() - started
    if [d["shard"] for d in repaired["damaged_shards"]] != [str(folder)]:
        problems.append(f"repair set aside {repaired['damaged_shards']}")
    again = json.loads(_docqueue(env, "repair", "--vectors", "--json").stdout)
    if again["damaged_shards"] or again["requeued_vector_chunks"]:
        problems.append(f"a second repair changed something: {again}")
    done_before = conn.execute(CHUNK_COMPLETIONS_SQL).fetchone()[0]
    started = time.monotonic()
    _docqueue(env, "run", "--until-idle")
    run_s = time.monotonic() - started
    rebuilt = conn.execute(CHUNK_COMPLETIONS_SQL).fetchone()[0] - done_before
    return {
        "shard": side,
        "file": file,
        "how": how,
        "said": said.removeprefix("docqueue: ")[:300],
        "rebuilt_chunks": repaired["requeued_vector_chunks"],
        "kept_as": Path(repaired["damaged_shards"][0]["kept_as"]).name if repaired["damaged_shards"] else None,
        "detect_s": round(detect_s, 1),
        "repair_s": round(repair_s, 1),
        "rebuild_run_s": round(run_s, 1),
        "rebuild_s": round(repair_s + run_s, 1),
        "rebuild_per_s": round(rebuilt / run_s, 2),
        "problems": problems,
    }


def _child(env: dict, what: str) -> dict:
    """One store operation in a process of its own (a shard admits one process): `index` moves the tail's points
    into the main shard, `folders` names the shards, `count` counts points and the graph."""
    return child_figures(env, "bench._damaged_stores", "row 6", what)


def in_child(what: str) -> None:
    from queue_db.config import Settings
    from resources.embeddings import DEFAULT_MODEL, MODELS
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource
    from tests.reliability.support import graph_duplicates

    spec = MODELS[DEFAULT_MODEL]
    settings = Settings.from_env()
    vector = QdrantResource.from_settings(settings).get_store(spec.model_id, spec.dim)
    try:
        if what == "index":
            figures: dict = {"indexed": vector.optimize()}
        elif what == "folders":
            figures = {"main": str(vector.folder), "tail": str(vector.tail_folder)}
        else:
            graph = Neo4jResource.from_settings(settings).get_store()
            try:
                figures = {
                    "points": vector.count(),
                    "chunk_ids": len(vector.chunk_ids()),
                    "graph": graph.counts(),
                    "graph_duplicates": sum(graph_duplicates(graph).values()),
                }
            finally:
                graph.close()
    finally:
        vector.close()
    print(json.dumps(figures))
