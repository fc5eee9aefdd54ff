"""What the benches that run the whole pipeline in child processes share: a Bolt server of their own as an endpoint,
the environment of a docqueue process on its own home, databases and that server, the `docqueue` commands and
store operations run in children, and (rows 6 and 7 of bench/faults.py) the counts and figures of a damaged store.

Not a bench of its own (tests/acceptance/test_bench_smoke.py leaves out the modules whose names start with an
underscore)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def own_bolt_server(home: Path, port: int, host: str = "127.0.0.1"):
    """An embedded Bolt server in `home` listening on `host`, as the endpoint dict the children's environment takes;
    stopped after."""
    from resources.bolt_server import BoltServer

    server = BoltServer(home=home, port=port, host=host)
    try:
        yield {
            "uri": server.ensure_running(timeout_s=180),
            "user": server.user,
            "password": server.password,
            "database": server.database,
        }
    finally:
        server.stop()


def pipeline_env(home: Path, queue_url: str, dagster_url: str, bolt: dict) -> dict[str, str]:
    """The settings of a docqueue process on `home` (embedded Qdrant under it), its queue and Dagster databases, and
    the Bolt endpoint; the caller lays them over its own environment."""
    return {
        "DOCQUEUE_HOME": str(home),
        "DOCQUEUE_DATABASE_URL": queue_url,
        "DOCQUEUE_DAGSTER_PG_URL": dagster_url,
        "DAGSTER_HOME": str(home / "dagster"),
        "DOCQUEUE_QDRANT_PATH": str(home / "qdrant"),
        "DOCQUEUE_QDRANT_URL": "",
        "DOCQUEUE_NEO4J_URI": bolt["uri"],
        "DOCQUEUE_NEO4J_USER": bolt["user"],
        "DOCQUEUE_NEO4J_PASSWORD": bolt["password"],
        "DOCQUEUE_NEO4J_DATABASE": bolt["database"] or "",
        "PYTHONUNBUFFERED": "1",
    }


def docqueue_env(home: Path, queue_url: str, dagster_url: str, bolt: dict, **overrides: str) -> dict[str, str]:
    """This process's environment with pipeline_env's settings and `overrides` laid over it, for a docqueue child
    run from the repository."""
    return {**os.environ, **pipeline_env(home, queue_url, dagster_url, bolt), **overrides, "PYTHONPATH": str(REPO)}


def migrated_queue(databases, name: str) -> str:
    """The URL of a new queue database `name` (made by `databases.create`), its schema upgraded."""
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    queue_url = databases.create(name)
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    return queue_url


def docqueue(env: dict, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """`docqueue ARGS` in a child process; exits with its error output when it fails and `check`."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise SystemExit(f"docqueue {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return done


def child_figures(env: dict, module: str, label: str, what: str) -> dict:
    """`module`'s in_child(what) in a process of its own (a store admits one process): the JSON of its last line.
    `label` names the caller in the error when the child fails."""
    done = subprocess.run(
        [sys.executable, "-c", f"from {module} import in_child; in_child({what!r})"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"{label}'s {what} child failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def verified_clean(env: dict) -> bool:
    """`docqueue verify` found the stores consistent with the queue."""
    verify = docqueue(env, "verify", "--json", check=False)
    return verify.returncode == 0 and bool(json.loads(verify.stdout).get("consistent"))


def unfinished_and_chunks(conn) -> tuple[int, int]:
    """The tasks not completed (pages' OCR, chunks' vector or GraphRAG step) and the chunks, over a psycopg
    connection to the queue database."""
    unfinished = conn.execute(
        "SELECT (SELECT count(*) FROM task_queue_page WHERE ocr_status <> 'completed') + "
        "(SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed' "
        "OR graphrag_status <> 'completed')"
    ).fetchone()[0]
    return unfinished, conn.execute("SELECT count(*) FROM task_queue_chunk").fetchone()[0]


def damage_row(
    faults: dict[str, dict],
    checks: Sequence[tuple[str, object]],
    *,
    lost: int,
    consistent: bool,
    chunks: int,
    before: dict,
    after: dict,
    completed_twice: int,
    corpus: dict,
    clean: tuple[str, float],
    extra: dict | None = None,
) -> dict:
    """A damaged-store row's figures (faults.py's keys). `faults`: each fault's figures, whose `problems` become
    errors; `checks`: the row's own (problem, bad), judged after tasks lost and verify and before the graph's;
    `before` and `after`: the stores' counts around the faults (each with `graph` and `graph_duplicates`);
    `clean`: the name of the clean run's rate in each fault's figures, and that rate; `extra`: figures after
    `chunks`."""
    errors = [f"{name}: {problem}" for name, fault in faults.items() for problem in fault.pop("problems")]
    for problem, bad in (
        ("tasks not completed", lost),
        ("verify not clean at the end", not consistent),
        *checks,
        ("duplicate nodes or edges", after["graph_duplicates"]),
        ("the graph's counts changed", after["graph"] != before["graph"]),
    ):
        if bad:
            errors.append(problem)
    clean_key, clean_per_s = clean
    return {
        "faults_injected": len(faults),
        "work_done": sum(f["rebuilt_chunks"] for f in faults.values()),
        "tasks_lost": lost,
        "completed_twice": completed_twice,
        "duplicate_nodes_edges": after["graph_duplicates"],
        "fenced_rejected": 0,
        "rollup_mismatches": 0,
        "reconcile_corrections": 0,
        "corpus": corpus,
        "chunks": chunks,
        **(extra or {}),
        "graph_before": before["graph"],
        "graph_after": after["graph"],
        "by_fault": {name: {**fault, clean_key: clean_per_s} for name, fault in faults.items()},
        "detect_s": max(f["detect_s"] for f in faults.values()),
        "rebuild_s": max(f["rebuild_s"] for f in faults.values()),
        "tasks_per_s": {"clean": clean_per_s, "during": {n: f["rebuild_per_s"] for n, f in faults.items()}},
        "errors": errors,
    }
