"""Row 7 of bench/faults.py, a damaged graph store: the pipeline itself, driven through the `docqueue` commands as a
person would, on the embedded Bolt server (DOCQUEUE_NEO4J_URI unset) of a home of its own.

A generated corpus is ingested and `docqueue run --until-idle` takes it through every phase (the clean run, whose
chunk completions per second are the reference). Five times a file of the graph's database folder is damaged while
the server is down: twice with the server stopped (closed cleanly: statistics.json written, the write-ahead log
deleted), the Chunk bucket file deleted, then (after the first rebuild) schema.json cut to nothing; twice with the
server SIGKILLed (no statistics.json, its log kept), an edge-list file deleted right after the kill, then the Chunk
bucket file cut to nothing after a kill, a start that replayed the log, a run that wrote the GraphRAG step of half
the chunks again, and a second kill (so the bucket's first pages are on disk and in no log); last, the MENTIONS edge
bucket's last page cut after a kill, a start that replayed the log and wrote nothing, and a second kill (the file
check passes that folder: verify finds the chunks short of their MENTIONS edges). After each kill, before the
damage, the folder must read as whole. Each time `docqueue verify` must name the folder in one sentence with exit
code 3 (time to detect), `docqueue repair --graph` sets the folder aside and re-queues the GraphRAG step of the
completed chunks (time to repair; a second repair must change nothing) and `docqueue run --until-idle` rewrites
them (time to rebuild). Then the counts: tasks lost (not completed), the graph's node and edge counts against those
before the damage, duplicate nodes and edges, the vector points (the same chunk ids, untouched), and `docqueue
verify` clean.

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

# (name, how the server goes down, the file of the database folder, what is done to it): ArcadeDB reads the first
# as a graph without chunks, loads the previous schema (without the types made since) for the second, skips the
# edges of the third's vertices, stops its log's replay at the fourth's version gap, and opens the fifth (its last
# page cut, none of its pages in the log: the file check passes it) without those MENTIONS edges, which verify
# finds by the chunks' counts of them
DAMAGES = (
    ("deleted-bucket", "stop", "Chunk_0.*.bucket", "delete"),
    ("cut-schema", "stop", "schema.json", "truncate"),
    ("killed-deleted-edge-list", "kill", "Entity_0_out_edges.*", "delete"),
    ("killed-cut-bucket", "kill-after-rewrite", "Chunk_0.*.bucket", "truncate"),
    ("killed-cut-edge-bucket", "kill-after-replay", "MENTIONS_0.*.bucket", "cut-page"),
)
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
            faults = {
                name: _damage_and_rebuild(env, conn, before, name, down, file, how) for name, down, file, how in DAMAGES
            }
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


def _take_down(env: dict, down: str) -> tuple[Path, list[str], dict]:
    """Stop or SIGKILL the server (after a kill, a replay of its log and a rewrite of half the chunks' graph, for
    `kill-after-rewrite`); returns its folder, problems, and what was seen of the killed folder before the damage."""
    if down == "stop":
        return Path(_child(env, "stop")["folder"]), [], {}
    problems: list[str] = []
    if down == "kill-after-replay":  # a start replays the log and writes nothing: the next kill's log is empty
        _child(env, "kill")
        _docqueue(env, "verify", "--json", check=False)
    if down == "kill-after-rewrite":
        _child(env, "kill")
        _child(env, "rewrite")
        _docqueue(env, "run", "--until-idle")  # starts the server: the log is replayed, then half the chunks rewritten
    killed = _child(env, "kill")
    if killed["damage"] is not None:
        problems.append(f"the killed server's folder read as damaged before the damage: {killed['damage']}")
    seen = {"logs_bytes": killed["logs_bytes"], "check_ms": killed["check_ms"], "whole_after_kill": not problems}
    return Path(killed["folder"]), problems, seen


def _damage_and_rebuild(env: dict, conn, before: dict, name: str, down: str, file: str, how: str) -> dict:
    folder, problems, seen = _take_down(env, down)
    target = sorted(folder.glob(file))[0]
    damaged_file = f"{target.name} ({target.stat().st_size} bytes)"
    if how == "truncate":
        os.truncate(target, 0)
    elif how == "cut-page":  # its last page gone, the file ending on a page boundary
        page_size = int(target.name.split(".")[2])
        os.truncate(target, max(0, target.stat().st_size // page_size - 1) * page_size)
    else:
        target.unlink()
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
        "down": down,
        "file": damaged_file,
        "how": how,
        **seen,
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
    folder), `kill` SIGKILLs it (and checks its folder as files), `rewrite` re-queues the GraphRAG step of half the
    completed chunks, `count` counts the graph, its duplicates and the vector points."""
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
    if what == "kill":
        print(json.dumps(_kill(server)))
        return
    if what == "rewrite":
        print(json.dumps({"requeued": _requeue_half(settings)}))
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


def _kill(server) -> dict:
    """SIGKILL the running server, as a killed machine or test process leaves it; then the file check's verdict on
    its folder, how long the check took and how large its write-ahead log is."""
    import signal

    from resources.bolt_files import folder_damage

    pid = server._our_pid()
    if pid is None:
        raise SystemExit("row 7: no running Bolt server to kill")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while server._our_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    server.stop()  # forgets the dead server's state file
    folder = server.database_folder
    started = time.perf_counter()
    damage = folder_damage(folder)
    check_ms = round((time.perf_counter() - started) * 1000, 1)
    logs = sum(log.stat().st_size for log in folder.glob("txlog_*.wal"))
    return {"folder": str(folder), "damage": damage, "check_ms": check_ms, "logs_bytes": logs}


def _requeue_half(settings) -> int:
    """Put the GraphRAG step of every other completed chunk back to pending (the next run writes it again)."""
    from orchestration.cli.context import open_queue
    from queue_db.phases import GRAPHRAG_CHUNK

    queue = open_queue(settings)
    try:
        with queue.engine.connect() as conn:
            ids = [
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT id FROM task_queue_chunk WHERE graphrag_status = 'completed' ORDER BY id"
                )
            ]
        return queue.requeue(GRAPHRAG_CHUNK, ids[::2], "bench: row 7 writes half the chunks' graph again")
    finally:
        queue.engine.dispose()
