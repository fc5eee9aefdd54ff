"""`docqueue db`: the queue's schema and Dagster's storage (upgrade, status) and the embedded servers (stop)."""

from __future__ import annotations

import click

from orchestration.cli.errors import EXIT_FAILURE, service_errors, service_failures
from orchestration.cli.output import emit
from orchestration.dagster_database import dagster_storage_status, ensure_dagster_database
from orchestration.environment import dagster_instance, prepare_environment, redact
from queue_db.config import Settings
from queue_db.database_urls import embedded_postgres
from queue_db.migrate import available_migrations, pending_migrations, upgrade, upgrade_script
from queue_db.queue import create_queue_engine
from resources.bolt_server import BoltServer


@click.group()
def db() -> None:
    """The queue database."""


@db.command("upgrade")
@click.option(
    "--sql",
    "print_sql",
    is_flag=True,
    help="print the queue schema's migrations as one psql script instead, without connecting anywhere",
)
@click.option(
    "--from",
    "from_version",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="with --sql: only the migrations after this version (`docqueue db status` shows a database's)",
)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_obj
def db_upgrade(settings: Settings, print_sql: bool, from_version: int, as_json: bool) -> None:
    """Create or migrate the queue's schema and Dagster's storage (idempotent).

    Dagster's storage database (DOCQUEUE_DAGSTER_PG_URL, else `<queue database>_dagster` beside the queue's, or
    `dagster` beside `docqueue`) is created when missing and the role may create databases."""
    if print_sql:
        click.echo(upgrade_script(from_version), nl=False)
        return
    with service_failures():
        environment = prepare_environment(settings)
        applied = upgrade(create_queue_engine(environment.queue_url))
        created = ensure_dagster_database(environment.dagster_url, environment.queue_url)
        instance = dagster_instance(settings)
        instance.upgrade()
        renamed = _carry_renamed_assets(instance)
    vectors = _migrate_embedded_vectors(settings)
    payload = {
        "applied": [f"{m.version:04d}_{m.name}" for m in applied],
        "version": max(m.version for m in available_migrations()),
        "database": redact(environment.queue_url),
        "dagster_database": redact(environment.dagster_url),
        "dagster_database_created": created,
        "vector_store_migrated": vectors,
        "renamed_assets_moved": renamed,
    }
    emit(
        as_json,
        payload,
        lambda: click.echo(
            (
                f"applied {len(applied)} migration(s): {', '.join(payload['applied'])}"
                if applied
                else "schema is up to date"
            )
            + f" (version {payload['version']}, {payload['database']}); Dagster's storage "
            + ("created and migrated" if created else "is up to date")
            + f" ({payload['dagster_database']})"
            + (f"; moved {vectors['points']} vectors from the old embedded Qdrant into Qdrant Edge" if vectors else "")
            + "".join(
                f"; moved {moved['events']} event(s) of asset {old} to {moved['renamed_to']}"
                for old, moved in renamed.items()
                if moved["events"]
            )
        ),
    )


def _carry_renamed_assets(instance) -> dict[str, dict]:
    """Former asset name -> {renamed_to, events moved}: the history of renamed assets follows them."""
    # imported here: the asset modules bring Dagster, which the other db commands do not load
    from orchestration.asset_renames import carry_history, renamed_assets
    from queue_db.phases import PHASES

    renames = renamed_assets(PHASES)
    moved = carry_history(instance.event_log_storage.engine, renames)
    return {old: {"renamed_to": renames[old], "events": count} for old, count in moved.items()}


def _former_assets_with_history(instance) -> list[str]:
    from orchestration.asset_renames import former_keys_with_history, renamed_assets
    from queue_db.phases import PHASES

    return former_keys_with_history(instance.event_log_storage.engine, renamed_assets(PHASES))


def _migrate_embedded_vectors(settings: Settings) -> dict:
    """Embedded storage written by qdrant-client's local mode moves into Qdrant Edge shards (a no-op otherwise)."""
    vector = settings.vector
    if vector.url is not None:
        return {}
    # imported here: the migration brings qdrant-client and Dagster, which a server's vector store does not need
    from resources.qdrant_migrate import migrate_local_mode
    from resources.vector_stores import vector_store_settings

    with service_errors():
        return migrate_local_mode(
            vector_store_settings(settings).path, batch=vector.migrate_batch, lock_timeout_s=vector.lock_timeout_s
        )


@db.command("status")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
@click.pass_obj
def db_status(settings: Settings, as_json: bool) -> None:
    """Pending migrations of the queue's schema and of Dagster's storage (exit 1 when some are pending: `docqueue
    db upgrade` applies them). Applies none; Dagster itself creates its tables in an empty storage database."""
    with service_failures():
        environment = prepare_environment(settings)
        pending = pending_migrations(create_queue_engine(environment.queue_url))
        opened: list = []  # the instance the storage check opens, read again for the former names

        def open_instance():
            opened.append(dagster_instance(settings))
            return opened[-1]

        dagster = dagster_storage_status(environment.dagster_url, open_instance)
        if opened:
            # history still under an asset's former name shows as missing partitions until it moves
            dagster["former_asset_names"] = _former_assets_with_history(opened[-1])
            dagster["pending"] = dagster["pending"] or bool(dagster["former_asset_names"])
    payload = {
        "queue": {
            "version": max(m.version for m in available_migrations()),
            "pending": [f"{m.version:04d}_{m.name}" for m in pending],
        },
        "dagster": dagster,
    }

    def human() -> None:
        click.echo(
            "queue schema: "
            + (
                f"{len(pending)} migration(s) pending: {', '.join(payload['queue']['pending'])}"
                if pending
                else f"up to date (version {payload['queue']['version']})"
            )
        )
        if dagster["database"] != "ok":
            click.echo(f"Dagster's storage: {dagster['database']}")
        for name, versions in dagster["storages"].items():
            current = versions["at"] == versions["head"]
            state = "up to date" if current else f"at {versions['at']}, needs {versions['head']}"
            click.echo(f"Dagster's {name} storage: {state}")
        if dagster.get("former_asset_names"):
            click.echo(
                "Dagster's history under former asset names: "
                + ", ".join(dagster["former_asset_names"])
                + " (`docqueue db upgrade` moves it to the current names)"
            )

    emit(as_json, payload, human)
    if pending or dagster["pending"]:
        raise SystemExit(EXIT_FAILURE)


@db.command("stop")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def db_stop(settings: Settings, as_json: bool) -> None:
    """Stop the embedded PostgreSQL and Bolt servers started under DOCQUEUE_HOME."""
    stopped_pg = embedded_postgres(settings.database).stop()
    bolt = BoltServer.from_settings(settings)
    stopped_bolt = bolt.is_running() and (bolt.stop() or True)
    emit(
        as_json,
        {"postgres_stopped": stopped_pg, "bolt_stopped": bool(stopped_bolt)},
        lambda: click.echo(
            f"embedded PostgreSQL {'stopped' if stopped_pg else 'was not running'}; "
            f"Bolt server {'stopped' if stopped_bolt else 'was not running'}"
        ),
    )
