"""Looking at the queue: `docqueue status` (per document), `stats` (per task kind) and `verify` (queue against
the stores)."""

from __future__ import annotations

import click

from orchestration.cli.context import document_or_fail, open_queue, tenant_filter, tenant_option
from orchestration.cli.errors import EXIT_INCONSISTENT, EXIT_USAGE, CliError, first_line, service_errors
from orchestration.cli.output import console, emit, table
from orchestration.verify import verify_stores
from queue_db.config import Settings
from queue_db.near_duplicates import group_counts
from queue_db.phases import PHASES, Level, PhaseRegistry, PhaseSpec
from queue_db.readmodels import document_progress_rows, error_classes_rows, phase_timings_rows, queue_statistics_rows
from queue_db.run_costs import run_size_rows


@click.command()
@click.argument("document", required=False)
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="documents per page, in registration order",
)
@click.option("--after", "after_key", metavar="KEY", help="the page after the document with this key")
@tenant_option("only this tenant's documents (default: every tenant's)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (its next_after names the next page)")
@click.pass_obj
def status(
    settings: Settings, document: str | None, limit: int, after_key: str | None, tenant: str | None, as_json: bool
) -> None:
    """Per document: the three phase statuses, pages, chunks, progress and last errors, a page at a time."""
    tenant = tenant_filter(settings, tenant)
    queue = open_queue(settings, direct=True)
    doc_id = str(document_or_fail(queue, document, tenant)["id"]) if document else None
    if after_key and queue.document(after_key) is None:
        raise CliError(f"no document with key {after_key!r} to continue after", EXIT_USAGE)
    records = document_progress_rows(
        queue.engine, doc_id, limit=None if doc_id else limit, after_key=after_key, tenant=tenant
    )
    next_after = records[-1]["document_key"] if not doc_id and len(records) == limit else None

    def human() -> None:
        _print_status(records)
        if next_after:
            click.echo(f"more: docqueue status --after {next_after}" + (f" --tenant {tenant}" if tenant else ""))

    emit(as_json, {"documents": records, "next_after": next_after}, human)


def _print_status(records: list[dict], phases: PhaseRegistry = PHASES) -> None:
    """One row per document: each phase's status (or `blocked`) with its deepest kind's completed/total tasks
    and failed ones, the document's pages and chunks, why a phase was skipped, its last error."""

    def phase_cell(record: dict, phase: PhaseSpec) -> str:
        status = (
            "blocked"
            if phase.name in record["blocked_phases"]
            else record[phase.rollup_column(Level.DOCUMENT, "status")]
        )
        level = phase.leaf.level.value
        completed, failed = (
            record.get(f"{phase.column_prefix}_{outcome}_{level}s") for outcome in ("completed", "failed")
        )
        if completed is None:  # a document-level phase: its status says it all
            return status
        total = record.get(f"total_{level}s", 0)
        return f"{status} {completed}/{total}" + (f", {failed} failed" if failed else "")

    def notes(record: dict) -> str:
        said = (
            [f"{record['pages_without_text']} pages without text: embedding skipped"]
            if record["pages_without_text"]
            else []
        )
        if record["extraction_skipped"]:
            said.append("re-indexed on the text extracted before")
        if record.get("engine") == "pdfium":
            said.append("pages read by pdfium: PyMuPDF found none")
        return "; ".join(said + _group_note(record))

    def last_error(record: dict) -> str:
        return next((error for p in phases if (error := record[p.rollup_column(Level.DOCUMENT, "error")])), "")

    console().print(
        table(
            "documents",
            [
                "document",
                *(f"{p.name} (of {p.leaf.level.value}s)" for p in phases),
                "pages",
                "chunks",
                "notes",
                "last error",
                "failed at",
            ],
            [
                [
                    r["document_key"],
                    *(phase_cell(r, p) for p in phases),
                    r["total_pages"],
                    r["total_chunks"],
                    notes(r),
                    last_error(r),
                    r["last_failed_at"] or "",
                ]
                for r in records
            ],
        )
    )


def _group_note(record: dict) -> list[str]:
    """The document's content group of near duplicates: its copies' keys and the group's representative."""
    group = record.get("content_group")
    if not group:
        return []
    keys = ", ".join(group["keys"]) + ("…" if group["copies"] > len(group["keys"]) else "")
    return [f"near duplicates ({group['copies']}): {keys}; group of {group['representative']}"]


@click.command()
@tenant_option("only this tenant's tasks (default: the whole queue)")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def stats(settings: Settings, tenant: str | None, as_json: bool) -> None:
    """Queue statistics (task type x status x count), queue wait and per-phase durations (over at most
    DOCQUEUE_STATS_WINDOW completed tasks per type: a sample once the history is longer)."""
    tenant = tenant_filter(settings, tenant)
    queue = open_queue(settings, direct=True)
    window = settings.queue.stats_window
    counts, timings, errors = (
        queue_statistics_rows(queue.engine, tenant),
        phase_timings_rows(queue.engine, window, tenant),
        error_classes_rows(queue.engine, tenant),
    )
    groups = group_counts(queue.engine, tenant)
    sizes = run_size_rows(
        queue.engine,
        [kind.name for spec in queue.phases for kind in spec.kinds],
        settings.dagster.max_keys_per_run,
        settings.dagster.run_overhead_share,
    )

    def human() -> None:
        shown = console()
        shown.print(
            table(
                "queue", ["task type", "status", "count"], [[r["task_type"], r["status"], r["count"]] for r in counts]
            )
        )
        shown.print(
            table(
                "timings (seconds)",
                ["task type", "completed", "wait median", "wait p95", "run median", "run p95"],
                [
                    [
                        r["task_type"],
                        f"{r['completed']}{' (sample)' if r['sampled'] else ''}",
                        *(
                            f"{r[k]:.3f}" if r[k] is not None else ""
                            for k in ("wait_median_s", "wait_p95_s", "run_median_s", "run_p95_s")
                        ),
                    ]
                    for r in timings
                ],
            )
        )
        if any(r["sampled"] for r in timings):
            shown.print(
                f"timings over at most {window:,} completed tasks per type, from a random sample of the "
                "table's blocks (DOCQUEUE_STATS_WINDOW)"
            )
        shown.print(
            table(
                "run sizes (what the planners go by: DOCQUEUE_RUN_OVERHEAD_SHARE, DOCQUEUE_RUN_MAX_KEYS_<KIND>)",
                ["task type", "runs measured", "work a key (s)", "before the work (s)", "keys a run", "maximum"],
                [
                    [
                        r["task_type"],
                        r["runs"],
                        "" if r["key_s"] is None else f"{r['key_s']:.4f}",
                        "" if r["overhead_s"] is None else f"{r['overhead_s']:.3f}",
                        r["keys_per_run"],
                        r["max_keys"],
                    ]
                    for r in sizes
                ],
            )
        )
        shown.print(
            f"content groups: {groups['groups']:,}, holding {groups['copies']:,} near-duplicate cop"
            f"{'y' if groups['copies'] == 1 else 'ies'} beside their representatives"
        )
        if errors:
            shown.print(
                table(
                    "error classes",
                    ["task type", "class", "count"],
                    [[r["task_type"], r["error_class"], r["count"]] for r in errors],
                )
            )

    emit(
        as_json,
        {
            "counts": counts,
            "timings": timings,
            "timings_window": window,
            "error_classes": errors,
            "content_groups": groups,
            "run_sizes": sizes,
        },
        human,
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def verify(settings: Settings, as_json: bool) -> None:
    """Cross-check queue, Qdrant and graph; exit 3 when anything is inconsistent."""
    # a damaged shard of the embedded store is one sentence naming it (exit 3 too): every stored point is read back
    # imported here: the stores bring Dagster, qdrant-client and the Bolt driver, seconds `status` and `stats`
    # (this module's other commands) do not need
    from orchestration.repair import graph_damage
    from orchestration.stores import opened_stores
    from resources.bolt_driver import neo4j
    from resources.bolt_server import BoltServer
    from resources.ports import GraphStoreDamaged, VectorStoreDamaged

    queue = open_queue(settings)
    # the embedded graph's folder: its damage is found at the server's start (its files), by a read that fails, or
    # by a graph holding none of the chunks the queue says were written
    folder = None if settings.graph.uri else BoltServer.from_settings(settings).database_folder
    with service_errors():
        try:
            with opened_stores(settings) as (store, graph):
                try:
                    report = verify_stores(queue, store, graph, page_size=settings.dagster.verify_page)
                except (neo4j.exceptions.ClientError, neo4j.exceptions.DatabaseError) as exc:
                    # a refused login is the credentials', not the folder's
                    if folder is None or isinstance(exc, neo4j.exceptions.AuthError):
                        raise
                    raise GraphStoreDamaged(folder, f"a read failed: {first_line(exc)}") from None
            lost = graph_damage(
                report.completed_graph_chunks, len(report.chunks_without_graph), len(report.chunks_short_of_mentions)
            )
            if folder is not None and lost is not None:
                raise GraphStoreDamaged(folder, lost)
        except (VectorStoreDamaged, GraphStoreDamaged) as exc:
            # the store cannot be read back, so nothing else can be counted: its one sentence is the result
            if as_json:
                where = {"shard": exc.folder} if isinstance(exc, VectorStoreDamaged) else {"folder": exc.folder}
                emit(True, {"consistent": False, "damaged": str(exc), **where}, lambda: None)
            raise CliError(str(exc), EXIT_INCONSISTENT) from None
    payload = report.as_dict()
    emit(
        as_json,
        payload,
        lambda: console().print(
            table("verify", ["check", "value"], [[k, v] for k, v in payload.items() if k != "examples"])
        ),
    )
    if not report.consistent:
        short = len(report.chunks_short_of_mentions)
        # on a Bolt server at a URI (the embedded one's folder is named above): rewriting the chunks is left to
        # whoever keeps that server, since into a folder whose edge lists still name the lost edges it doubles them
        named = (
            f"{short} completed chunk(s) lack entity mentions in the graph, which nothing here re-queues; "
            if short
            else ""
        )
        raise CliError(
            f"inconsistent: {named}see the counts above; `docqueue recover` and the nightly reconciliation "
            "re-queue missing vectors and graph writes",
            EXIT_INCONSISTENT,
        )
