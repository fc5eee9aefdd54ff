"""`docqueue ingest`: register documents, from files, folders or standard input."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestration.cli.context import open_queue, tenant_option, tenant_or_default
from orchestration.cli.errors import EXIT_USAGE, CliError
from orchestration.cli.output import console, emit, table
from orchestration.intake import IntakeRules, ingest_paths, ingest_stream, iter_files
from queue_db.config import Settings
from resources.storage import LocalStorage, storage_root

READABLE = "PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML, DOCX, XLSX or CSV files"


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--priority", type=click.IntRange(0, 10), default=0, show_default=True, help="0-10, higher first")
@click.option(
    "--password-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="file holding the password of these (encrypted) PDFs; its path, not the password, is stored",
)
@click.option("--name", help="the file name of content read from standard input (PATH `-`), e.g. note.md")
@click.option(
    "--idempotency-key",
    help="names this registration: the same key again is the same document, "
    "the key with other content is refused (one file or `-`)",
)
@tenant_option("the tenant (project) the documents belong to; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def ingest(
    settings: Settings,
    paths: tuple[Path, ...],
    priority: int,
    password_file: Path | None,
    name: str | None,
    idempotency_key: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Register documents (PDF, PNG/JPEG/TIFF, EPUB, XPS, text, Markdown, HTML, DOCX, XLSX, CSV) or folders of them
    (recursively); `-` reads one document from standard input (with --name)."""
    # Only the queue is written: each document's Dagster partition is registered by the next sensor tick or
    # `docqueue run`, which both register every row without one, so ingest never loads Dagster.
    stdin = Path("-") in paths
    if stdin and len(paths) > 1:
        raise CliError("`-` (standard input) cannot be combined with other paths; ingest them separately", EXIT_USAGE)
    if stdin and not name:
        raise CliError("content from standard input needs a file name: add --name, e.g. --name note.md", EXIT_USAGE)
    if stdin and sys.stdin.isatty():
        raise CliError(
            "`-` reads the document from standard input, which is a terminal here; pipe the content in, "
            "e.g. `cat note.md | docqueue ingest - --name note.md`",
            EXIT_USAGE,
        )
    if name and not stdin:
        raise CliError("--name names content from standard input only; give `-` as the path", EXIT_USAGE)
    missing = [str(p) for p in paths if not stdin and not p.exists()]
    if missing:
        raise CliError(f"no such file or folder: {', '.join(missing)}", EXIT_USAGE)
    if password_file is not None and not password_file.is_file():
        raise CliError(f"password file {password_file} does not exist", EXIT_USAGE)
    tenant = tenant_or_default(settings, tenant)
    files = [] if stdin else list(iter_files(paths))
    if not stdin and not files:
        raise CliError(f"no files found in the given paths; give {READABLE} or folders that contain them", EXIT_USAGE)
    if idempotency_key is not None and len(files) > 1:
        raise CliError(
            f"--idempotency-key names one document, and the paths hold {len(files)} files; give one file or `-`",
            EXIT_USAGE,
        )
    queue = open_queue(settings, direct=True)
    storage = LocalStorage(storage_root(settings))
    if stdin:
        results = [
            ingest_stream(
                queue,
                storage,
                click.get_binary_stream("stdin"),
                name,
                priority=priority,
                scratch=settings.database.home_path() / "tmp",
                idempotency_key=idempotency_key,
                tenant=tenant,
                rules=IntakeRules.from_settings(settings),
            )
        ]
    else:
        password_ref = f"file:{password_file.resolve()}" if password_file else None
        results = ingest_paths(
            queue,
            storage,
            paths,
            priority=priority,
            password_ref=password_ref,
            idempotency_key=idempotency_key,
            tenant=tenant,
            rules=IntakeRules.from_settings(settings),
        )
    payload = {
        "tenant": tenant,
        "results": [r.as_dict() for r in results],
        "counts": {s: sum(1 for r in results if r.status == s) for s in ("new", "duplicate", "rejected")},
    }
    emit(
        as_json,
        payload,
        lambda: console().print(
            table(
                "ingest",
                ["file", "status", "document", "id / reason"],
                [[r.path, r.status, r.document_key or "", r.document_id or r.reason] for r in results],
            )
        ),
    )
    if idempotency_key is not None and results and results[0].status == "rejected":
        raise CliError(f"nothing was registered: {results[0].reason}")
    if results and all(r.status == "rejected" for r in results):
        raise CliError(
            "nothing was registered, every file was rejected: "
            + _rejections(results)
            + f"; give {READABLE} (the content decides, not the name)"
        )


def _rejections(results, shown: int = 3) -> str:
    reasons = [f"{Path(r.path).name} ({r.reason})" for r in results[:shown]]
    more = len(results) - shown
    return ", ".join(reasons) + (f" and {more} more" if more > 0 else "")
