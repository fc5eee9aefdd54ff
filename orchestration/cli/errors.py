"""The one error mapping of the `docqueue` commands: a failure the user can act on is one sentence on stderr with
an exit code, never a traceback (unless DOCQUEUE_DEBUG=1)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click

EXIT_USAGE, EXIT_FAILURE, EXIT_INCONSISTENT, EXIT_TASKS_FAILED = 2, 1, 3, 4
STORE_HINT = "check DOCQUEUE_QDRANT_URL / DOCQUEUE_QDRANT_PATH and DOCQUEUE_NEO4J_URI"


class CliError(click.ClickException):
    """A failure the user can act on: printed as one sentence on stderr."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.exit_code = code

    def show(self, file=None) -> None:
        click.echo(f"docqueue: {self.message}", err=True)


# The failures of a service docqueue cannot reach or start, by (module, class). An exception of one of these classes
# exists only once its module is loaded, so the mapping looks the classes up among the loaded modules instead of
# importing them: `status` never pays for Dagster, Qdrant or the Bolt driver to learn that PostgreSQL is down.
# tests/unit/test_cli_conventions.py imports every one, so a moved class fails there.
SERVICE_FAILURES = {
    "own": (
        ("queue_db.server_ports", "PortInUseError"),
        ("orchestration.dagster_database", "DagsterStorageError"),
        ("orchestration.stores", "UnknownEmbeddingModel"),
        ("resources.disk_space", "DiskFull"),
        ("resources.ports", "VectorStoreDamaged"),
        ("resources.ports", "GraphStoreDamaged"),
    ),
    "postgres_start": (("queue_db.embedded_postgres", "EmbeddedPostgresError"),),
    "postgres": (("sqlalchemy.exc", "OperationalError"), ("psycopg", "OperationalError")),
    "bolt_start": (("resources.bolt_server", "BoltServerError"),),
    "graph": (
        ("neo4j.exceptions", "ServiceUnavailable"),
        ("neo4j.exceptions", "AuthError"),
        ("neo4j.exceptions", "SessionExpired"),
    ),
    "vectors": (
        ("resources.ports", "VectorStoreError"),
        ("qdrant_client.http.exceptions", "ResponseHandlingException"),
        ("httpx", "HTTPError"),
    ),
}


def _is(exc: BaseException, kind: str) -> bool:
    loaded = tuple(
        cls
        for module, name in SERVICE_FAILURES[kind]
        if (cls := getattr(sys.modules.get(module), name, None)) is not None
    )
    return bool(loaded) and isinstance(exc, loaded)


def known_failure(exc: BaseException) -> CliError | None:
    """The sentence for a service docqueue cannot reach or start; None for anything else."""
    if _is(exc, "own"):
        return CliError(str(exc))
    if _is(exc, "postgres_start"):
        return CliError(
            f"the embedded PostgreSQL could not start ({first_line(exc)}); "
            "check DOCQUEUE_HOME is writable or set DOCQUEUE_DATABASE_URL"
        )
    if _is(exc, "postgres"):
        return CliError(
            f"cannot connect to PostgreSQL ({first_line(getattr(exc, 'orig', None) or exc)}); check "
            "DOCQUEUE_DATABASE_URL or unset it to use the embedded server"
        )
    if _is(exc, "bolt_start"):
        return CliError(
            f"the embedded Bolt server could not start ({first_line(exc)}); check DOCQUEUE_HOME is "
            "writable or set DOCQUEUE_NEO4J_URI"
        )
    if _is(exc, "graph"):
        return CliError(
            f"cannot use the graph store ({type(exc).__name__}: {first_line(exc)}); "
            "check DOCQUEUE_NEO4J_URI, DOCQUEUE_NEO4J_USER and DOCQUEUE_NEO4J_PASSWORD"
        )
    if _is(exc, "vectors"):
        return CliError(f"cannot use the vector store ({type(exc).__name__}: {first_line(exc)}); {STORE_HINT}")
    return None


def unexpected_failure(exc: Exception, debug: bool) -> CliError | None:
    """Any other error as one sentence naming it; None (keep the traceback) under DOCQUEUE_DEBUG."""
    known = known_failure(exc)
    if known is not None:
        return known
    if debug:
        return None
    return CliError(f"failed with {type(exc).__name__}: {first_line(exc)} (set DOCQUEUE_DEBUG=1 to see where)")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def service_failures():
    """An unreachable or unstartable service is one sentence (see known_failure), not a traceback."""
    try:
        yield
    except Exception as exc:
        known = known_failure(exc)
        if known is None:
            raise
        raise known from None


@contextmanager
def service_errors():
    """As service_failures; besides, a file-system error while opening the stores is the embedded Qdrant's."""
    with service_failures():
        try:
            yield
        except OSError as exc:
            raise CliError(
                f"cannot use the vector or graph store ({type(exc).__name__}: {first_line(exc)}); " + STORE_HINT
            ) from None
