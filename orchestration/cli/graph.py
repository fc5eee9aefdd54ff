"""`docqueue graph`: an entity of the knowledge graph, its mentions and its related entities."""

from __future__ import annotations

import click

from orchestration.cli.context import open_queue, tenant_option, tenant_or_default
from orchestration.cli.errors import CliError, service_failures
from orchestration.cli.output import console, emit, table
from orchestration.stores import open_graph
from queue_db.config import Settings


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
        raise CliError(
            f"no entity {entity!r} in the graph of tenant {tenant!r} (names are matched case- and "
            "punctuation-insensitively)"
        )

    def human() -> None:
        shown = console()
        shown.print(f"[bold]{found['name']}[/bold] ({found['type']})")
        shown.print(
            table("mentions", ["document", "page"], [[m["filename"], m["page_number"]] for m in found["mentions"]])
        )
        shown.print(
            table(
                "related",
                ["entity", "type", "relation", "direction", "weight"],
                [[r["name"], r["type"], r["rel_type"], r["direction"], r["weight"]] for r in found["related"]],
            )
        )

    emit(as_json, found, human)
