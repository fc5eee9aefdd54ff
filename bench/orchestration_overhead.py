"""What Dagster costs on top of the work: the same corpus processed end to end two ways, each on fresh databases.

  (a) dagster  the path users run: `docqueue run --until-idle` semantics, i.e. orchestration.runner.run_until_idle
               executing ranged runs in-process against a real instance (the repo's dagster.yaml: PostgreSQL,
               pooled storages), every page and chunk a partition materialized one by one, roll-ups included;
  (b) plain    the same orchestration.pipeline.Pipeline functions in a loop: claim -> process -> complete, per kind in
               phase order, with the same heartbeats and batch sizes, no Dagster; then each document placed in its
               content group of near duplicates, the product work (a)'s OCR roll-up does beside its events.

Each variant runs in its own child process (so neither inherits the other's loaded models) against its own queue
database, Dagster database, Qdrant folder and an emptied graph on one Bolt server. The time measured is from
"files registered in the queue" to "idle"; the child's start-up (imports, instance) is reported apart. (a) is
instrumented in-process: planning rounds, each run's wall time, the time inside the queue work (process_keys) and
every Dagster event written (count and time per type), which splits (a)'s extra time into per-run overhead and
per-key events.

  .venv/bin/python bench/orchestration_overhead.py [--documents 20] [--pages 10] [--repeats 1]
        [--admin-url URL] [--event-batch-size N] [--max-keys KIND=N ...] [--dagster-async-commit] [--profile DIR]

Experiments on (a): --event-batch-size sets DAGSTER_EVENT_BATCH_SIZE, --max-keys the keys per run of a kind,
--dagster-async-commit gives (a)'s Dagster connections synchronous_commit=off (the queue stays synchronous).
With --repeats N the variants alternate order each round; `ratio` compares the medians of the two variants' times,
`ratio_median_of_rounds` is the median of each round's own ratio (the pair ran back to back, so a load that drifts
between rounds moves it least), and `ratio_within_a` is the last round's (a) over its own queue work
(`ratio_within_a_median_of_rounds` over every round); --profile DIR runs each
child under cProfile and writes its statistics there. The admin URL (default
DOCQUEUE_TEST_PG_ADMIN_URL, else an embedded PostgreSQL started for the run) must be allowed to CREATE/DROP
DATABASE. Prints both times and the ratio (a)/(b) and ends with exactly one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._pipeline_env import own_bolt_server, pipeline_env  # noqa: E402
from bench._result import print_result  # noqa: E402

PARAGRAPHS = [
    "The harbour authority of Rotterdam reported that container traffic grew for the third year in a row, while "
    "the new rail terminal near Venlo took over a fifth of the inland freight that used to travel by road.",
    "Marie Laurent, who directs the logistics institute in Lyon, presented a study of delivery routes in Paris and "
    "Brussels and argued that night deliveries would cut congestion without raising costs for small shops.",
    "In Hamburg the shipyard of Blohm and Voss finished two research vessels for the University of Bergen; both "
    "ships carry laboratories for ocean chemistry and will map the currents of the North Atlantic.",
    "The committee in Geneva reviewed the annual figures of the Northern Railway Company, whose director Anna "
    "Keller announced a timetable with hourly trains between Zurich and Milan from the spring onwards.",
    "Farmers in Andalusia switched large areas to drip irrigation after the dry summer, and the cooperative in "
    "Seville now sells its olive oil directly to supermarkets in Madrid, Lisbon and Marseille.",
    "A consortium led by Siemens and the Technical University of Munich tested hydrogen buses on the routes "
    "between Augsburg and Ingolstadt and published the fuel figures for the first winter of service.",
]


# ------------------------------------------------------------------------------------------------ corpus
def make_corpus(folder: Path, documents: int, pages: int) -> list[Path]:
    from tests import pdf_factory as pf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in range(documents):
        content = []
        for p in range(pages):
            first, second = PARAGRAPHS[(d + p) % len(PARAGRAPHS)], PARAGRAPHS[(d + 2 * p + 1) % len(PARAGRAPHS)]
            content.append(
                [
                    f"# Report {d + 1}, part {p + 1}",
                    first,
                    f"## Notes {p + 1}",
                    second,
                    "- schedules reviewed\n- budgets approved\n- contracts renewed",
                ]
            )
        paths.append(pf.text_pdf(folder, f"report-{d + 1:02d}.pdf", content))
    return paths


# ------------------------------------------------------------------------------------------------ the children
def _ingest(queue, corpus: Path) -> int:
    from orchestration.intake import ingest_paths
    from queue_db.config import Settings
    from resources.storage_resource import StorageResource

    results = ingest_paths(queue, StorageResource.from_settings(Settings.from_env()).get_storage(), [corpus])
    assert all(r.status == "new" for r in results), [r.as_dict() for r in results if r.status != "new"]
    return len(results)


def child_plain(corpus: Path) -> dict:
    from orchestration.assets.common import CLAIM_BATCH
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline
    from queue_db.config import Settings
    from queue_db.heartbeat import Heartbeat
    from queue_db.phases import ALL_KINDS
    from queue_db.queue import make_worker_id
    from resources.database import open_queue

    settings = Settings.from_env()
    queue = open_queue(settings)
    documents = _ingest(queue, corpus)
    started = time.perf_counter()
    pipeline = Pipeline.from_settings(queue, settings)
    worker = make_worker_id("bench-plain")
    batches, by_kind = 0, defaultdict(float)
    try:
        progress = True
        while progress:
            progress = False
            for kind in ALL_KINDS:
                kind_started = time.perf_counter()
                with Heartbeat(queue, kind, worker) as heartbeat:
                    while tasks := queue.claim(kind, worker, CLAIM_BATCH[kind.name]):
                        ids = [t["id"] for t in tasks]
                        heartbeat.add(ids)
                        process_tasks(pipeline, kind, worker, tasks)
                        heartbeat.remove(ids)
                        batches += 1
                        progress = True
                by_kind[kind.name] += time.perf_counter() - kind_started
        grouping_started = time.perf_counter()
        place_in_content_groups(queue, settings)
        by_kind["content_groups"] = time.perf_counter() - grouping_started
    finally:
        pipeline.close()
    return {
        "documents": documents,
        "seconds": time.perf_counter() - started,
        "batches": batches,
        "seconds_by_kind": {k: round(v, 2) for k, v in by_kind.items()},
    }


def place_in_content_groups(queue, settings) -> None:
    """What the OCR roll-up does beside its materializations, and a product without Dagster would do too: sign each
    document whose OCR completed and place it in its content group of near duplicates (orchestration.content_groups),
    from the same figures the roll-up reads."""
    from orchestration.content_groups import place_documents
    from queue_db.partition_keys import document_rollup
    from resources.storage_resource import StorageResource

    with queue.engine.connect() as conn:
        keys = [row[0] for row in conn.exec_driver_sql("SELECT document_key FROM documents ORDER BY document_key")]
    figures = document_rollup(queue.engine, "ocr", keys)
    completed = [f for f in figures.values() if f["status"] == "completed"]
    storage = StorageResource.from_settings(settings).get_storage()
    place_documents(queue, storage, completed, settings.near_duplicates)


class DagsterProbe:
    """Accumulates where the Dagster path spends its time, by wrapping functions of the runner in this process."""

    def __init__(self):
        self.planning_s = 0.0
        self.runs: list[dict] = []
        self.work_s = 0.0
        self.events = defaultdict(lambda: [0, 0.0])  # event type -> [count, seconds]

    def install(self, instance) -> None:
        import orchestration.assets.common as common
        import orchestration.runner as runner

        plan_next, execute, process_keys = runner.plan_next, runner.execute, common.process_keys

        def timed_plan_next(*args, **kwargs):
            started = time.perf_counter()
            try:
                return plan_next(*args, **kwargs)
            finally:
                self.planning_s += time.perf_counter() - started

        def timed_execute(defs, inst, run, *args, **kwargs):
            started, work_before = time.perf_counter(), self.work_s
            ok = execute(defs, inst, run, *args, **kwargs)
            self.runs.append(
                {
                    "name": run.name,
                    "keys": run.size,
                    "seconds": time.perf_counter() - started,
                    "work_s": self.work_s - work_before,
                    "ok": ok,
                }
            )
            return ok

        def timed_process_keys(*args, **kwargs):
            started = time.perf_counter()
            try:
                return process_keys(*args, **kwargs)
            finally:
                self.work_s += time.perf_counter() - started

        runner.plan_next, runner.execute, common.process_keys = timed_plan_next, timed_execute, timed_process_keys
        handle_new_event = instance.handle_new_event

        def timed_handle_new_event(event, *args, **kwargs):
            started = time.perf_counter()
            try:
                return handle_new_event(event, *args, **kwargs)
            finally:
                kind = event.dagster_event.event_type_value if event.dagster_event else "LOG_MESSAGE"
                self.events[kind][0] += 1
                self.events[kind][1] += time.perf_counter() - started

        instance.handle_new_event = timed_handle_new_event

    def summary(self) -> dict:
        per_key_types = ("ASSET_MATERIALIZATION_PLANNED", "ASSET_MATERIALIZATION", "ASSET_FAILED_TO_MATERIALIZE")
        per_key = [v for k, v in self.events.items() if k in per_key_types]
        other = [v for k, v in self.events.items() if k not in per_key_types]
        task_runs = [r for r in self.runs if not r["name"].startswith("rollup_")]
        rollups = [r for r in self.runs if r["name"].startswith("rollup_")]
        return {
            "planning_s": round(self.planning_s, 2),
            "runs": len(self.runs),
            "task_runs": len(task_runs),
            "rollup_runs": len(rollups),
            "run_wall_s": round(sum(r["seconds"] for r in self.runs), 2),
            "task_run_wall_s": round(sum(r["seconds"] for r in task_runs), 2),
            "rollup_run_wall_s": round(sum(r["seconds"] for r in rollups), 2),
            "work_in_runs_s": round(self.work_s, 2),
            "per_key_events": sum(v[0] for v in per_key),
            "per_key_event_s": round(sum(v[1] for v in per_key), 2),
            "other_events": sum(v[0] for v in other),
            "other_event_s": round(sum(v[1] for v in other), 2),
            "events": {
                k: {"count": v[0], "ms_each": round(1000 * v[1] / v[0], 2)}
                for k, v in sorted(self.events.items(), key=lambda item: -item[1][1])
            },
            "runs_by_name": {
                name: {
                    "runs": sum(1 for r in self.runs if r["name"] == name),
                    "keys": sum(r["keys"] for r in self.runs if r["name"] == name),
                    "wall_s": round(sum(r["seconds"] for r in self.runs if r["name"] == name), 2),
                    "work_s": round(sum(r["work_s"] for r in self.runs if r["name"] == name), 2),
                }
                for name in dict.fromkeys(r["name"] for r in self.runs)
            },
        }


def child_dagster(corpus: Path) -> dict:
    from orchestration.definitions import defs
    from orchestration.environment import dagster_instance
    from orchestration.loaded_heap import freeze_loaded
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings
    from queue_db.phases import Level
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    freeze_loaded()  # as a `docqueue run` worker does once its definitions and instance are loaded
    documents = _ingest(queue, corpus)
    probe = DagsterProbe()
    probe.install(instance)
    started = time.perf_counter()
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    report = run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, poll_s=0.5)
    seconds = time.perf_counter() - started
    instance.dispose()
    return {"documents": documents, "seconds": seconds, "failed_runs": report.failed_runs, **probe.summary()}


def child_main(variant: str, corpus: Path) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("dagster").setLevel(logging.WARNING)
    started = time.perf_counter()
    if variant == "dagster":
        import orchestration.definitions  # noqa: F401 - what `docqueue run` imports before any work
    else:
        import orchestration.pipeline  # noqa: F401
    startup = time.perf_counter() - started
    result = child_dagster(corpus) if variant == "dagster" else child_plain(corpus)
    print("CHILD " + json.dumps({"startup_s": round(startup, 2), **result}))


# ------------------------------------------------------------------------------------------------ the parent
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def postgres(admin_url: str | None, root: Path):
    if admin_url:
        yield admin_url.replace("postgresql+psycopg://", "postgresql://")
        return
    from queue_db.embedded_postgres import EmbeddedPostgres

    server = EmbeddedPostgres(root / "pg", port=free_port())
    server.ensure_running()
    try:
        yield f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    finally:
        server.stop(mode="immediate")


class Databases:
    def __init__(self, admin_url: str):
        self.admin_url, self.created = admin_url, []

    def create(self, prefix: str) -> str:
        import psycopg

        name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def clean_graph(bolt) -> None:
    import neo4j

    with neo4j.GraphDatabase.driver(bolt["uri"], auth=(bolt["user"], bolt["password"])) as driver:
        with driver.session(database=bolt["database"]) as session:
            while session.run("MATCH (n) WITH n LIMIT 5000 DETACH DELETE n RETURN count(*) AS n").single()["n"]:
                pass


def outcome(queue_url: str) -> dict:
    """What a variant produced, to check both did the same work."""
    import sqlalchemy as sa

    engine = sa.create_engine(queue_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            """SELECT (SELECT count(*) FROM task_queue_page WHERE ocr_status = 'completed'),
                      (SELECT count(*) FROM task_queue_page WHERE ocr_status <> 'completed'),
                      (SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'completed'),
                      (SELECT count(*) FROM task_queue_chunk WHERE graphrag_status = 'completed'),
                      (SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed'
                                                             OR graphrag_status <> 'completed'),
                      (SELECT count(*) FROM documents WHERE graphrag_index_status = 'completed'),
                      (SELECT count(*) FROM document_signatures)"""
        ).one()
    engine.dispose()
    return {
        "pages": row[0],
        "pages_not_completed": row[1],
        "vectors": row[2],
        "graph_chunks": row[3],
        "chunks_not_completed": row[4],
        "documents_completed": row[5],
        "documents_signed": row[6],
    }


def run_variant(
    variant: str,
    corpus: Path,
    databases: Databases,
    bolt: dict,
    root: Path,
    extra_env: dict,
    async_commit: bool = False,
    profile: Path | None = None,
) -> dict:
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    queue_url = databases.create("queue")
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    home = root / f"{variant}-{uuid.uuid4().hex[:6]}"
    clean_graph(bolt)
    dagster_url = databases.create("dagster")
    if async_commit:  # a crash of the server may lose the last ~0.6 s of Dagster events; the queue stays durable
        dagster_url += "?options=-c%20synchronous_commit%3Doff"
    env = {**os.environ, **pipeline_env(home, queue_url, dagster_url, bolt), **extra_env}
    started = time.perf_counter()
    # with --profile the child runs under cProfile: one statistics file per child
    profiler = ["-m", "cProfile", "-o", str(profile / f"{variant}-{uuid.uuid4().hex[:6]}.prof")] if profile else []
    done = subprocess.run(
        [sys.executable, *profiler, __file__, "--child", variant, "--corpus", str(corpus)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHILD ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{variant} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("CHILD ") :])
    shutil.rmtree(home, ignore_errors=True)
    return {**result, "process_wall_s": round(wall, 2), "outcome": outcome(queue_url)}


def parent_main(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="docqueue-bench-orch-"))
    extra_env = {}
    if args.event_batch_size:
        extra_env["DAGSTER_EVENT_BATCH_SIZE"] = str(args.event_batch_size)
    for item in args.max_keys:
        kind, _, value = item.partition("=")
        extra_env[f"DOCQUEUE_RUN_MAX_KEYS_{kind.upper()}"] = value
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus"
    make_corpus(corpus, args.documents, args.pages)
    load_before = os.getloadavg()
    rounds = []
    with services(root, args.admin_url) as (bolt, databases):
        for repeat in range(args.repeats):
            # alternate the order: the machine is shared, and a later variant may meet a warmer page cache
            order = ("plain", "dagster") if repeat % 2 == 0 else ("dagster", "plain")
            rounds.append(
                {
                    v: run_variant(
                        v,
                        corpus,
                        databases,
                        bolt,
                        root,
                        extra_env,
                        args.dagster_async_commit and v == "dagster",
                        args.profile,
                    )
                    for v in order
                }
            )
            for variant in order:
                r = rounds[-1][variant]
                print(
                    f"round {repeat + 1} {variant:7s}: {r['seconds']:7.1f} s processing "
                    f"(start-up {r['startup_s']:.1f} s, process {r['process_wall_s']:.1f} s) {r['outcome']}",
                    flush=True,
                )
    report(args, rounds, load_before, os.getloadavg(), extra_env)


@contextmanager
def services(root: Path, admin_url: str | None):
    """A Bolt server and a PostgreSQL to create databases on (both the bench's own); `root` is removed after."""
    try:
        with own_bolt_server(root / "bolt", free_port()) as bolt:
            with postgres(admin_url or os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL"), root) as url:
                databases = Databases(url)
                try:
                    yield bolt, databases
                finally:
                    databases.drop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _median(values: list[float]) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def report(args, rounds: list[dict], load_before, load_after, extra_env: dict) -> None:
    plain = _median([r["plain"]["seconds"] for r in rounds])
    dagster = _median([r["dagster"]["seconds"] for r in rounds])
    last = rounds[-1]["dagster"]
    same_work = all(r["plain"]["outcome"] == r["dagster"]["outcome"] for r in rounds)
    extra = dagster - plain
    pages = last["outcome"]["pages"]
    chunks = last["outcome"]["vectors"]
    print(
        f"\ncorpus: {args.documents} documents x {args.pages} pages = {pages} pages, {chunks} chunks; "
        f"same outcome both ways: {same_work}"
    )
    # each round's two variants ran back to back: their ratio is the figure a drifting load moves least
    by_round = [r["dagster"]["seconds"] / r["plain"]["seconds"] for r in rounds]
    within_a = [r["dagster"]["seconds"] / max(r["dagster"]["work_in_runs_s"], 1e-9) for r in rounds]
    print(f"(b) plain loop : {plain:7.1f} s")
    print(f"(a) dagster    : {dagster:7.1f} s   ratio (a)/(b) = {dagster / plain:.2f} (target <= 1.10)")
    if len(rounds) > 1:
        print(
            f"    per round: {', '.join(f'{x:.3f}' for x in by_round)}; their median {_median(by_round):.3f}, "
            f"(a) over its own queue work {_median(within_a):.3f}"
        )
    events_s = last["per_key_event_s"] + last["other_event_s"]
    run_rest = last["run_wall_s"] - last["work_in_runs_s"] - events_s
    print(f"extra time of (a): {extra:.1f} s. Where (a) spends its time (last round, {last['seconds']:.1f} s):")
    print(
        f"  queue work inside runs (process_keys: claim, process, complete): {last['work_in_runs_s']:6.1f} s "
        f"(the plain loop: {rounds[-1]['plain']['seconds']:.1f} s)"
    )
    print(
        f"  per-key events: {last['per_key_events']} ({last['per_key_events'] // 2} keys x planned + materialized) "
        f"in {last['per_key_event_s']:6.1f} s = {1000 * last['per_key_event_s'] / max(last['per_key_events'], 1):.1f}"
        f" ms each"
    )
    print(
        f"  per-run events: {last['other_events']} in {last['other_event_s']:.1f} s; other per-run work (plans, "
        f"resources, steps) {run_rest:.1f} s over {last['runs']} runs ({last['rollup_runs']} of them roll-ups, "
        f"{last['rollup_run_wall_s']:.1f} s)"
    )
    print(f"  planning rounds (partition registration, queries, in-flight lookups): {last['planning_s']:.1f} s")
    print(
        f"  (a) / its own queue work = {within_a[-1]:.2f} "
        "(measured inside one process, less sensitive to the shared machine than (a)/(b))"
    )
    plain_by_kind = rounds[-1]["plain"]["seconds_by_kind"]
    for name, figures in last["runs_by_name"].items():
        counterpart = "content_groups" if name == "rollup_ocr" else name  # (b)'s share of the OCR roll-up's work
        same = f"   plain loop {plain_by_kind[counterpart]:6.1f} s" if counterpart in plain_by_kind else ""
        print(
            f"    {name:16s} runs {figures['runs']:3d} keys {figures['keys']:5d} wall {figures['wall_s']:7.1f} s "
            f"work {figures['work_s']:7.1f} s{same}"
        )
    print(f"machine load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} cores)")
    result = {
        "documents": args.documents,
        "pages": pages,
        "chunks": chunks,
        "repeats": args.repeats,
        "plain_s": round(plain, 2),
        "dagster_s": round(dagster, 2),
        "ratio": round(dagster / plain, 3),
        "same_outcome": same_work,
        "env": extra_env,
        "dagster_async_commit": args.dagster_async_commit,
        "ratio_by_round": [round(x, 3) for x in by_round],
        "ratio_median_of_rounds": round(_median(by_round), 3),
        "ratio_within_a": round(within_a[-1], 3),
        "ratio_within_a_median_of_rounds": round(_median(within_a), 3),
        "dagster_breakdown": {k: v for k, v in last.items() if k not in ("outcome", "events", "runs_by_name")},
        "events": last["events"],
        "runs_by_name": last["runs_by_name"],
        "plain_seconds_by_kind": rounds[-1]["plain"]["seconds_by_kind"],
        "startup_s": {"plain": rounds[-1]["plain"]["startup_s"], "dagster": last["startup_s"]},
        "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
        "rounds": [{v: round(r[v]["seconds"], 2) for v in ("plain", "dagster")} for r in rounds],
    }
    print_result(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--event-batch-size", type=int, default=0, help="DAGSTER_EVENT_BATCH_SIZE for (a)")
    parser.add_argument(
        "--dagster-async-commit",
        action="store_true",
        help="(a)'s Dagster connections with synchronous_commit=off (experiment)",
    )
    parser.add_argument(
        "--max-keys",
        action="append",
        default=[],
        metavar="KIND=N",
        help="keys per run of a task kind for (a), e.g. vector_chunk=2000",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, metavar="DIR", help="run each child under cProfile, stats into DIR"
    )
    parser.add_argument("--child", choices=("plain", "dagster"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.corpus)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
