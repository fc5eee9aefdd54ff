"""Row 4 of bench/faults.py on documents: `docqueue run --until-idle` SIGKILLed again and again while it works
through a mixed corpus, and every document must end as it ends without faults.

The corpus is generated: text PDFs of several pages, a scanned page (OCR), a Markdown file, and three inputs that
fail for good (a truncated PDF, an encrypted PDF without its password, a PNG named .pdf). It runs twice, on homes
and databases of their own and an emptied graph each time:

- clean: `docqueue ingest`, then `docqueue run --until-idle`; its end state is the reference;
- killed: `docqueue ingest`, then `docqueue run --until-idle` started and SIGKILLed (its whole process group, PDF
  worker included) `--document-kills` times, each at a random moment after it has claimed work; before each restart the
  recovery job's stale release hands the dead worker's tasks back, as its sensor does. A last run goes to idle.

Each document's end state (its phases' statuses and error classes and messages, its pages' statuses, its chunks'
statuses and content hashes in order) must equal the clean run's; the points, graph nodes and edges must equal the
clean run's counts with no duplicate; `docqueue verify` must be clean. A killed worker's tasks spend an attempt
(so a task that kills its worker every time ends failed instead of looping), so the row raises MAX_TASK_RETRIES
above the kills, and reports the most attempts one task spent.

Not a bench of its own (its name starts with an underscore): `faults.py --rows 4` runs it after the queue fleet.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench._damaged_stores import _child
from bench._pipeline_env import docqueue as _docqueue
from bench._pipeline_env import pipeline_env

REPO = Path(__file__).resolve().parents[1]
# seconds: the worker's tasks go back soon after it dies, and a retry is claimable soon after it fails
TIMINGS = {
    "STALE_TASK_TIMEOUT": "2",
    "HEARTBEAT_INTERVAL": "0.5",
    "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2",
    "DOCQUEUE_RETRY_BACKOFF_MAX": "1",
}
HELD_SQL = (
    "SELECT (SELECT count(*) FROM task_queue_page WHERE ocr_status = 'processing') + "
    "(SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'processing' OR graphrag_status = 'processing') + "
    "(SELECT count(*) FROM documents WHERE ocr_status = 'processing' AND pages_created_at IS NULL)"
)
OPEN_SQL = (
    "SELECT (SELECT count(*) FROM task_queue_page WHERE ocr_status IN ('pending', 'processing')) + "
    "(SELECT count(*) FROM task_queue_chunk WHERE vector_status IN ('pending', 'processing') "
    "OR graphrag_status IN ('pending', 'processing')) + "
    "(SELECT count(*) FROM documents WHERE pages_created_at IS NULL AND ocr_status IN ('pending', 'processing'))"
)
# what a document's run leaves, in words that do not depend on ids, workers or times
END_STATE_SQL = """
SELECT d.filename,
       d.ocr_status::text, d.vector_index_status::text, d.graphrag_index_status::text,
       d.ocr_error_class, d.vector_error_class, d.graphrag_error_class,
       d.ocr_error, d.vector_error, d.graphrag_error, d.page_count,
       (SELECT string_agg(p.page_number || ':' || p.ocr_status || ':' || COALESCE(p.ocr_error_class, ''), ','
                          ORDER BY p.page_number)
        FROM task_queue_page p WHERE p.document_id = d.id) AS pages,
       (SELECT md5(string_agg(p.page_number || ':' || c.chunk_index || ':' || c.vector_status || ':' ||
                              c.graphrag_status || ':' || COALESCE(c.chunk_content_hash, ''), ','
                              ORDER BY p.page_number, c.chunk_index))
        FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id WHERE c.document_id = d.id) AS chunks,
       (SELECT count(*) FROM task_queue_chunk c WHERE c.document_id = d.id) AS chunk_count
FROM documents d ORDER BY d.filename
"""
MOST_ATTEMPTS_SQL = (
    "SELECT GREATEST((SELECT max(retry_count) FROM documents), (SELECT max(ocr_retry_count) FROM task_queue_page), "
    "(SELECT max(vector_retry_count) FROM task_queue_chunk), (SELECT max(graphrag_retry_count) FROM task_queue_chunk))"
)


def mixed_corpus(folder: Path, documents: int, pages: int) -> list[Path]:
    """Text PDFs, a scanned page, Markdown, and three inputs that fail for good."""
    from bench.orchestration_overhead import make_corpus
    from tests import pdf_factory as pf

    paths = make_corpus(folder, documents, pages)
    paths.append(pf.scanned_pdf(folder, "scanned.pdf")[0])
    notes = folder / "notes.md"
    notes.write_text(
        "# Field notes\n\nThe survey team mapped the northern valley in April. Maria Lopez led the team from "
        "Santiago; the samples went to the laboratory in Valparaiso.\n\n## Findings\n\n- three new springs\n"
        "- an old mine entrance\n",
        encoding="utf-8",
    )
    paths.append(notes)
    paths += [pf.truncated_pdf(folder), pf.encrypted_pdf(folder, "locked.pdf", "no-one-has-it"), pf.not_a_pdf(folder)]
    return paths


def row(args, services: tuple, root: Path) -> dict:
    """The documents half of row 4 (faults.py's keys: faults_injected, work_done, tasks_lost, completed_twice,
    errors, ...). `services` is (the Bolt endpoint dict, a database factory with create(prefix) -> url)."""
    from bench.orchestration_overhead import clean_graph
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    bolt, databases = services
    rng = random.Random(args.seed + 40)
    corpus = root / "corpus-kills"
    mixed_corpus(corpus, args.kill_documents, args.kill_pages)
    runs = {}
    for name in ("clean", "killed"):
        queue_url = databases.create(f"kills_{name}_queue")
        engine = create_queue_engine(queue_url)
        upgrade(engine)
        engine.dispose()
        clean_graph(bolt)
        env = {
            **os.environ,
            **pipeline_env(root / f"home-kills-{name}", queue_url, databases.create(f"kills_{name}_dagster"), bolt),
            **TIMINGS,
            "MAX_TASK_RETRIES": str(args.document_kills + 3),
            "PYTHONPATH": str(REPO),
        }
        _docqueue(env, "ingest", str(corpus), check=False)  # exit 1: the inputs that fail for good
        runs[name] = _run(env, queue_url, args, rng, kills=args.document_kills if name == "killed" else 0, log=root)
    return _judge(runs)


def _run(env: dict, queue_url: str, args, rng: random.Random, kills: int, log: Path) -> dict:
    import psycopg

    from bench._fault_kit import TaskQueueHandle
    from queue_db.config import QueueSettings

    settings = QueueSettings(
        heartbeat_interval_s=float(TIMINGS["HEARTBEAT_INTERVAL"]),
        stale_timeout_s=float(TIMINGS["STALE_TASK_TIMEOUT"]),
        max_retries=int(env["MAX_TASK_RETRIES"]),
        retry_backoff_base_s=float(TIMINGS["DOCQUEUE_RETRY_BACKOFF_BASE"]),
        retry_backoff_max_s=float(TIMINGS["DOCQUEUE_RETRY_BACKOFF_MAX"]),
    )
    recovery = TaskQueueHandle(queue_url, settings)
    injected, waited_for_work, started = 0, [], time.monotonic()
    try:
        with psycopg.connect(queue_url, autocommit=True) as conn:
            while injected < kills and conn.execute(OPEN_SQL).fetchone()[0]:
                _release_held(conn, recovery, args.drain_timeout_s)
                worker = _start_run(env, log / f"kills-{injected + 1}.log")
                spawned = time.monotonic()
                if not _wait_for_claim(conn, worker, args.drain_timeout_s):
                    break  # it ran dry before claiming: nothing left to kill it in
                waited_for_work.append(time.monotonic() - spawned)
                time.sleep(rng.uniform(0.0, 2 * args.document_kill_gap_s))
                if worker.poll() is not None:
                    break
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
                injected += 1
            _release_held(conn, recovery, args.drain_timeout_s)
            last = _docqueue(env, "run", "--until-idle", check=False)
            seconds = time.monotonic() - started
            states = {r[0]: r[1:] for r in conn.execute(END_STATE_SQL).fetchall()}
            still_open = conn.execute(OPEN_SQL).fetchone()[0]
            attempts = conn.execute(MOST_ATTEMPTS_SQL).fetchone()[0]
    finally:
        recovery.close()
    verify = _docqueue(env, "verify", "--json", check=False)
    return {
        "kills": injected,
        "seconds": round(seconds, 1),
        "released": recovery.released,
        "first_claim_s": round(sorted(waited_for_work)[len(waited_for_work) // 2], 1) if waited_for_work else None,
        "last_run_exit": last.returncode,
        "last_run_said": last.stderr.strip().splitlines()[-1:] if last.stderr.strip() else [],
        "states": states,
        "open": still_open,
        "most_attempts": attempts or 0,
        "counts": _child(env, "count"),
        "verify_clean": verify.returncode == 0 and bool(json.loads(verify.stdout or "{}").get("consistent")),
    }


def _judge(runs: dict) -> dict:
    clean, killed = runs["clean"], runs["killed"]
    differ = sorted(
        name
        for name in clean["states"].keys() | killed["states"].keys()
        if clean["states"].get(name) != killed["states"].get(name)
    )
    errors = [f"{name} ended otherwise than without faults" for name in differ]
    for problem, bad in (
        ("the killed run's tasks are not all settled", killed["open"]),
        ("the clean run's tasks are not all settled", clean["open"]),
        ("verify not clean after the killed run", not killed["verify_clean"]),
        ("points differ from the clean run", killed["counts"]["points"] != clean["counts"]["points"]),
        ("the graph's counts differ from the clean run", killed["counts"]["graph"] != clean["counts"]["graph"]),
        ("duplicate nodes or edges", killed["counts"]["graph_duplicates"]),
        ("a point twice", killed["counts"]["points"] != killed["counts"]["chunk_ids"]),
        ("no kill landed", not killed["kills"]),
    ):
        if bad:
            errors.append(problem)
    chunks = sum(state[-1] for state in killed["states"].values())
    return {
        "faults_injected": killed["kills"],
        "work_done": chunks,
        "tasks_lost": killed["open"],
        "completed_twice": killed["counts"]["points"] - killed["counts"]["chunk_ids"],
        "duplicate_nodes_edges": killed["counts"]["graph_duplicates"],
        "documents": len(killed["states"]),
        "documents_as_clean": len(killed["states"]) - len(differ),
        "differing": differ,
        "outcomes": _outcomes(killed["states"]),
        "tasks_released": killed["released"],
        "most_attempts": killed["most_attempts"],
        "first_claim_s_median": killed["first_claim_s"],
        "clean_s": clean["seconds"],
        "killed_s": killed["seconds"],
        "points": killed["counts"]["points"],
        "graph": killed["counts"]["graph"],
        "errors": errors,
    }


def _outcomes(states: dict) -> dict[str, str]:
    """Each document's end in a few words: completed with its chunks, or its first unfinished phase and why."""
    said = {}
    for filename, state in states.items():
        statuses, classes, errors = state[0:3], state[3:6], state[6:9]
        if statuses == ("completed",) * 3:
            said[filename] = f"completed, {state[-1]} chunks"
            continue
        phase = next(i for i, status in enumerate(statuses) if status != "completed")
        said[filename] = f"{('ocr', 'vector', 'graphrag')[phase]} {statuses[phase]}"
        # a document's own class is its page-splitting step's; a page's failure names its class in the message
        if classes[phase]:
            said[filename] += f": {classes[phase]}"
        if errors[phase]:
            said[filename] += f": {errors[phase].splitlines()[0][:160]}"
    return said


def _release_held(conn, recovery, timeout_s: float) -> None:
    """The recovery job's stale release until no dead worker holds a task (its heartbeat goes stale first)."""
    deadline = time.monotonic() + timeout_s
    while conn.execute(HELD_SQL).fetchone()[0] and time.monotonic() < deadline:
        recovery.recover()
        time.sleep(0.3)


def _wait_for_claim(conn, worker: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if conn.execute(HELD_SQL).fetchone()[0]:
            return True
        if worker.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _start_run(env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestration.cli", "run", "--until-idle"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own process group: the kill takes its PDF worker too
        )
