"""Pytest fixtures for a real Bolt server, registered for every test by tests/conftest.py (pytest_plugins): a test
names `bolt_server` or `graph_store` as a parameter and never imports them. An imported fixture is a definition of
its own module, so each importing module would start, and keep until the session ends, a server of its own.

`bolt_server` (session scope) starts the embedded ArcadeDB Bolt server in a temporary home on a free port, shared by
the whole test session and stopped at its end, so parallel test runs never share a server or a port.  Set
DOCQUEUE_TEST_NEO4J_URI (+ DOCQUEUE_TEST_NEO4J_USER / _PASSWORD / _DATABASE) to run the same tests against another
Bolt server, e.g. a real Neo4j 5 -- its database is WIPED by `clean_graph`.

`graph_store` (function scope) is a `GraphStore` on an emptied database with the schema in place.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import neo4j
import pytest

from resources.bolt_graph import GraphStore
from resources.bolt_server import BoltServer

_DELETE_BATCH = 5000


@dataclass(frozen=True)
class BoltEndpoint:
    uri: str
    user: str
    password: str
    database: str | None
    start_seconds: float | None = None  # how long the server took to start (None: external or already running)

    def store(self, **kwargs) -> GraphStore:
        return GraphStore(self.uri, self.user, self.password, self.database, **kwargs)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_graph(endpoint: BoltEndpoint) -> None:
    """Delete every node and relationship (in bounded batches; schema and constraints stay)."""
    with neo4j.GraphDatabase.driver(endpoint.uri, auth=(endpoint.user, endpoint.password)) as driver:
        with driver.session(database=endpoint.database) as session:
            while True:
                deleted = session.execute_write(
                    lambda tx: tx.run(
                        "MATCH (n) WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS n", limit=_DELETE_BATCH
                    ).single()["n"]
                )
                if deleted == 0:
                    return


@pytest.fixture(scope="session")
def bolt_server(tmp_path_factory) -> BoltEndpoint:
    external = os.environ.get("DOCQUEUE_TEST_NEO4J_URI", "").strip()
    if external:
        yield BoltEndpoint(
            external,
            os.environ.get("DOCQUEUE_TEST_NEO4J_USER", "neo4j"),
            os.environ.get("DOCQUEUE_TEST_NEO4J_PASSWORD", ""),
            os.environ.get("DOCQUEUE_TEST_NEO4J_DATABASE") or None,
        )
        return
    server = BoltServer(home=tmp_path_factory.mktemp("bolt"), port=free_port())
    uri = server.ensure_running(timeout_s=120)
    try:
        yield BoltEndpoint(uri, server.user, server.password, server.database, server.last_start_seconds)
    finally:
        server.stop()


@pytest.fixture
def graph_store(bolt_server: BoltEndpoint) -> GraphStore:
    clean_graph(bolt_server)
    store = bolt_server.store()
    store.ensure_schema()
    try:
        yield store
    finally:
        store.close()
