"""What the benches that run the whole pipeline in child processes share: a Bolt server of their own as an endpoint,
and the environment of a docqueue process on its own home, databases and that server.

Not a bench of its own (tests/acceptance/test_bench_smoke.py leaves out the modules whose names start with an
underscore)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


@contextmanager
def own_bolt_server(home: Path, port: int):
    """An embedded Bolt server in `home`, as the endpoint dict the children's environment takes; stopped after."""
    from resources.bolt_server import BoltServer

    server = BoltServer(home=home, port=port)
    try:
        yield {
            "uri": server.ensure_running(timeout_s=180),
            "user": server.user,
            "password": server.password,
            "database": server.database,
        }
    finally:
        server.stop()


def pipeline_env(home: Path, queue_url: str, dagster_url: str, bolt: dict) -> dict[str, str]:
    """The settings of a docqueue process on `home` (embedded Qdrant under it), its queue and Dagster databases, and
    the Bolt endpoint; the caller lays them over its own environment."""
    return {
        "DOCQUEUE_HOME": str(home),
        "DOCQUEUE_DATABASE_URL": queue_url,
        "DOCQUEUE_DAGSTER_PG_URL": dagster_url,
        "DAGSTER_HOME": str(home / "dagster"),
        "DOCQUEUE_QDRANT_PATH": str(home / "qdrant"),
        "DOCQUEUE_QDRANT_URL": "",
        "DOCQUEUE_NEO4J_URI": bolt["uri"],
        "DOCQUEUE_NEO4J_USER": bolt["user"],
        "DOCQUEUE_NEO4J_PASSWORD": bolt["password"],
        "DOCQUEUE_NEO4J_DATABASE": bolt["database"] or "",
        "PYTHONUNBUFFERED": "1",
    }
