"""`docqueue search`: one hybrid search over the vectors, through the warm session applications keep open
(resources/search_session.py), each hit with the entities its chunk mentions. The module imports neither Dagster
nor the graph driver (it loads when the graph is read): a search is start-up, the model, the store and one read of
the graph."""

from __future__ import annotations

import click

from orchestration.cli import startup
from orchestration.cli.context import open_queue, tenant_option, tenant_or_default
from orchestration.cli.errors import EXIT_USAGE, CliError, service_errors
from orchestration.cli.hit_graph import graph_columns
from orchestration.cli.output import console, emit, table
from queue_db.config import Settings
from resources.folder_lock import keep_open_until_exit
from resources.search_session import Hit, SearchSession


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True, help="hits to show")
@click.option("--dense", is_flag=True, help="embedding similarity only (for comparison)")
@click.option("--sparse", is_flag=True, help="keyword (BM25-style) matching only (for comparison)")
@click.option(
    "--graph",
    "related",
    is_flag=True,
    help="also show, per hit, the entities most related to those its chunk mentions (DOCQUEUE_SEARCH_RELATED_PER_HIT)",
)
@click.option(
    "--all",
    "all_copies",
    is_flag=True,
    help="show every copy: near-duplicate documents of one content group give one hit without it",
)
@tenant_option("search this tenant's documents; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def search(
    settings: Settings,
    text: str,
    limit: int,
    dense: bool,
    sparse: bool,
    related: bool,
    all_copies: bool,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Hybrid search over the vectors: embedding similarity and keyword matching, fused by rank."""
    tenant = tenant_or_default(settings, tenant)
    if dense and sparse:
        raise CliError("--dense and --sparse exclude each other; give one, or neither for hybrid search", EXIT_USAGE)
    mode = "dense" if dense else "sparse" if sparse else "hybrid"
    queue = open_queue(settings, direct=True)  # before the model loads: an unreachable database is said at once
    # one search is start-up to the end: the model, the store, the Bolt driver's tables, all made once and kept
    # (orchestration/cli/startup.py)
    with service_errors(), startup.collector_paused():
        session = SearchSession(settings, engine=queue.engine)
        try:
            found = session.search(text, limit, tenant=tenant, mode=mode, graph=related, all_copies=all_copies)
        finally:
            if startup.ends_with_command():
                # the shards stay open to the process's end, which follows: closed, they would leave the page
                # cache, and the next search would read them from disk again (resources/folder_lock.py)
                keep_open_until_exit()
            session.close()
    if found.notice and not as_json:
        click.echo(found.notice, err=True)
    if found.graph_notice and not as_json:
        click.echo(found.graph_notice, err=True)

    def human() -> None:
        graph_names, graph_cells = graph_columns(found.hits, related)
        console().print(
            table(
                f"search ({found.mode}): {text}",
                ["score", "document", "page", "chunk", "text", *graph_names, "also in"],
                [
                    [h.score, h.document, h.page, h.chunk, (h.text or "")[:200], *cells, _copies_cell(h)]
                    for h, cells in zip(found.hits, graph_cells, strict=True)
                ],
            )
        )

    emit(as_json, found.as_dict(), human)


def _copies_cell(hit: Hit) -> str:
    """ "also in N documents: key, key…" for a hit whose document has near duplicates; empty otherwise."""
    if not hit.also_in:
        return ""
    more = "…" if hit.also_in > len(hit.also_in_keys) else ""
    return f"also in {hit.also_in} document{'s' if hit.also_in > 1 else ''}: {', '.join(hit.also_in_keys)}{more}"
