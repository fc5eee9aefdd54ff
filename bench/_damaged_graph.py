"""Row 7 of bench/faults.py, a damaged graph store: the pipeline itself, driven through the `docqueue` commands as a
person would, on the embedded Bolt server (DOCQUEUE_NEO4J_URI unset) of a home of its own.

A generated corpus is ingested and `docqueue run --until-idle` takes it through every phase (the clean run, whose
chunk completions per second are the reference). Twice, with the server stopped: the Chunk bucket file of the
graph's database folder is deleted, then (after the first rebuild) schema.json is cut to nothing. Each time
`docqueue verify` must name the folder in one sentence with exit code 3 (time to detect), `docqueue repair --graph`
sets the folder aside and re-queues the GraphRAG step of the completed chunks (time to repair; a second repair must
change nothing) and `docqueue run --until-idle` rewrites them (time to rebuild). Then the counts: tasks lost (not
completed), the graph's node and edge counts against those before the damage, duplicate nodes and edges, the vector
points (the same chunk ids, untouched), and `docqueue verify` clean.

Not a bench of its own (its name starts with an underscore): `faults.py --rows 7` runs it.
"""

from __future__ import annotations

import hashlib
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

# (name, the file of the database folder, what is done to it): ArcadeDB reads the first as a graph without chunks
# and loads the previous schema (without the types made since) for the second
DAMAGES = (("deleted-bucket", "Chunk_0.*.bucket", "delete"), ("cut-schema", "schema.json", "truncate"))
GRAPHRAG_DONE_SQL = "SELECT count(*) FROM task_queue_chunk WHERE graphrag_status = 'completed'"


def row(args, databases, root: Path) -> dict:
    """Row 7's figures (faults.py's keys: faults_injected, work_done, tasks_lost, completed_twice, errors, ...)."""
    import psycopg

    from bench.orchestration_overhead import free_port, make_corpus

    queue_url = migrated_queue(databases, "graph_queue")
    env = docqueue_env(
        root / "home-damaged-graph",
        queue_url,
        databases.create("graph_dagster"),
        {"uri": "", "user": "", "password": "", "database": ""},
        DOCQUEUE_BOLT_PORT=str(free_port()),
        DOCQUEUE_NEO4J_DATABASE="",
    )
    for name in ("DOCQUEUE_NEO4J_USER", "DOCQUEUE_NEO4J_PASSWORD"):
        env.pop(name, None)
    corpus = root / "corpus-damaged-graph"
    make_corpus(corpus, args.damaged_documents, args.damaged_pages)
    try:
        with psycopg.connect(queue_url, autocommit=True) as conn:
            _docqueue(env, "ingest", str(corpus))
            started = time.monotonic()
            _docqueue(env, "run", "--until-idle")
            clean_s = time.monotonic() - started
            clean_done = conn.execute(GRAPHRAG_DONE_SQL).fetchone()[0]
            before = _child(env, "count")
            faults = {name: _damage_and_rebuild(env, conn, before, name, file, how) for name, file, how in DAMAGES}
            after = _child(env, "count")
            lost, chunks = unfinished_and_chunks(conn)
        consistent = verified_clean(env)
    finally:
        _child(env, "stop")
    return damage_row(
        faults,
        [("the vector points changed", after["points"] != before["points"])],
        lost=lost,
        consistent=consistent,
        chunks=chunks,
        before=before,
        after=after,
        completed_twice=after["points"]["count"] - chunks,  # points beyond one a chunk
        corpus={"documents": args.damaged_documents, "pages": args.damaged_pages},
        clean=("clean_graph_chunks_per_s", round(clean_done / clean_s, 2)),
        extra={"points_unchanged": after["points"] == before["points"]},
    )


def _damage_and_rebuild(env: dict, conn, before: dict, name: str, file: str, how: str) -> dict:
    folder = Path(_child(env, "stop")["folder"])
    target = sorted(folder.glob(file))[0]
    if how == "truncate":
        os.truncate(target, 0)
    else:
        target.unlink()
    problems = []
    started = time.monotonic()
    verify = _docqueue(env, "verify", "--json", check=False)
    detect_s = time.monotonic() - started
    said = verify.stderr.strip()
    if verify.returncode != 3 or not said.startswith(f"docqueue: the graph database folder {folder} is damaged ("):
        problems.append(f"verify did not name the folder: exit {verify.returncode}, {said[-300:]}")
    if "\n" in said or "Traceback" in said:
        problems.append("verify said more than one sentence")
    started = time.monotonic()
    repaired = json.loads(_docqueue(env, "repair", "--graph", "--json").stdout)
    repair_s = time.monotonic() - started
    kept = repaired["damaged_folder"]
    if not kept or kept["folder"] != str(folder):
        problems.append(f"repair set aside {kept}")
    if repaired["requeued_graph_chunks"] != before["chunks"]:
        problems.append(f"repair re-queued {repaired['requeued_graph_chunks']} of {before['chunks']} chunks")
    again = json.loads(_docqueue(env, "repair", "--graph", "--json").stdout)
    if again["damaged_folder"] or again["requeued_graph_chunks"]:
        problems.append(f"a second repair changed something: {again}")
    done_before = conn.execute(GRAPHRAG_DONE_SQL).fetchone()[0]
    started = time.monotonic()
    _docqueue(env, "run", "--until-idle")
    run_s = time.monotonic() - started
    rebuilt = conn.execute(GRAPHRAG_DONE_SQL).fetchone()[0] - done_before
    return {
        "file": file,
        "how": how,
        "said": said.removeprefix("docqueue: ")[:300],
        "rebuilt_chunks": repaired["requeued_graph_chunks"],
        "kept_as": Path(kept["kept_as"]).name if kept else None,
        "detect_s": round(detect_s, 1),
        "repair_s": round(repair_s, 1),
        "rebuild_run_s": round(run_s, 1),
        "rebuild_s": round(repair_s + run_s, 1),
        "rebuild_per_s": round(rebuilt / run_s, 2),
        "problems": problems,
    }


def _child(env: dict, what: str) -> dict:
    """One store operation in a process of its own: `stop` stops the embedded Bolt server (and names its database
    folder), `count` counts the graph, its duplicates and the vector points."""
    return child_figures(env, "bench._damaged_graph", "row 7", what)


def in_child(what: str) -> None:
    from queue_db.config import Settings
    from resources.bolt_server import BoltServer

    settings = Settings.from_env()
    server = BoltServer.from_settings(settings)
    if what == "stop":
        server.stop()
        print(json.dumps({"folder": str(server.database_folder)}))
        return
    from resources.embeddings import DEFAULT_MODEL, MODELS
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource
    from tests.reliability.support import graph_duplicates

    spec = MODELS[DEFAULT_MODEL]
    vector = QdrantResource.from_settings(settings).get_store(spec.model_id, spec.dim)
    graph = Neo4jResource.from_settings(settings).get_store()
    try:
        ids = sorted(vector.chunk_ids())
        counts = graph.counts()
        figures = {
            "points": {"count": vector.count(), "ids": hashlib.sha256("".join(ids).encode()).hexdigest()[:16]},
            "chunks": counts["chunks"],
            "graph": counts,
            "graph_duplicates": sum(graph_duplicates(graph).values()),
        }
    finally:
        graph.close()
        vector.close()
    print(json.dumps(figures))
