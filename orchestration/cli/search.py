"""Finding things: `docqueue search` over the vectors and `docqueue graph` over the knowledge graph."""
from __future__ import annotations

import click

from orchestration.cli.context import open_queue, tenant_option, tenant_or_default
from orchestration.cli.errors import EXIT_USAGE, CliError, service_errors, service_failures
from orchestration.cli.output import console, emit, table
from orchestration.stores import open_embedder, open_graph, open_vectors
from queue_db.config import Settings
from queue_db.lifecycle import hidden_from_search


@click.command()
@click.argument("text")
@click.option("--limit", type=click.IntRange(1, 100), default=5, show_default=True, help="hits to show")
@click.option("--dense", is_flag=True, help="embedding similarity only (for comparison)")
@click.option("--sparse", is_flag=True, help="keyword (BM25-style) matching only (for comparison)")
@tenant_option("search this tenant's documents; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def search(settings: Settings, text: str, limit: int, dense: bool, sparse: bool, tenant: str | None,
           as_json: bool) -> None:
    """Hybrid search over the vectors: embedding similarity and keyword matching, fused by rank."""
    tenant = tenant_or_default(settings, tenant)
    if dense and sparse:
        raise CliError("--dense and --sparse exclude each other; give one, or neither for hybrid search", EXIT_USAGE)
    mode = "dense" if dense else "sparse" if sparse else "hybrid"
    queue = open_queue(settings)  # before the model loads: an unreachable database is said at once
    embedder = open_embedder(settings.embedding)
    with service_errors():
        store = open_vectors(settings, embedder.model_id, embedder.dim)
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
        console().print(table(f"search ({hits.mode}): {text}", ["score", "document", "page", "chunk", "text"],
                              [[r["score"], r["document"], r["page"], r["chunk"], (r["text"] or "")[:200]]
                               for r in rows]))

    emit(as_json, {"query": text, "mode": hits.mode, "notice": hits.notice, "hits": rows}, human)


@click.command()
@click.argument("entity")
@tenant_option("the tenant whose graph to read; default DOCQUEUE_DEFAULT_TENANT")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def graph(settings: Settings, entity: str, tenant: str | None, as_json: bool) -> None:
    """An entity, its type, its mentions (document, page) and its related entities."""
    tenant = tenant_or_default(settings, tenant)
    open_queue(settings)
    with service_failures():
        store = open_graph(settings)
        try:
            found = store.entity(entity, tenant=tenant)
        finally:
            store.close()
    if found is None:
        raise CliError(f"no entity {entity!r} in the graph of tenant {tenant!r} (names are matched case- and "
                       "punctuation-insensitively)")

    def human() -> None:
        shown = console()
        shown.print(f"[bold]{found['name']}[/bold] ({found['type']})")
        shown.print(table("mentions", ["document", "page"],
                          [[m["filename"], m["page_number"]] for m in found["mentions"]]))
        shown.print(table("related", ["entity", "type", "relation", "direction", "weight"],
                          [[r["name"], r["type"], r["rel_type"], r["direction"], r["weight"]]
                           for r in found["related"]]))

    emit(as_json, found, human)
