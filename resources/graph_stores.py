"""The Dagster resource that hands out graph stores: a Bolt server at a URI, else the embedded one it starts or
reuses."""

from __future__ import annotations

from pathlib import Path

import dagster

from queue_db.config import Settings, default
from queue_db.service_config import GraphConfig
from resources.bolt_graph import BATCH_SIZE, CONFLICT_RETRIES, TX_TIMEOUT_S, GraphStore
from resources.bolt_server import BoltServer, bolt_home


class Neo4jResource(dagster.ConfigurableResource):
    """The graph store; the entry point fills the fields (`Neo4jResource.from_settings`). An empty `uri` starts or
    reuses the embedded Bolt server in `bolt_home`. The password goes in as `dg.EnvVar(...)`, never a literal."""

    uri: str = ""  # DOCQUEUE_NEO4J_URI
    user: str = default(GraphConfig, "user")  # DOCQUEUE_NEO4J_USER
    password: str = ""  # DOCQUEUE_NEO4J_PASSWORD
    database: str = ""  # DOCQUEUE_NEO4J_DATABASE; empty = the server's default database
    batch_size: int = BATCH_SIZE  # DOCQUEUE_GRAPH_BATCH_SIZE: chunks per transaction
    tx_timeout_s: float = TX_TIMEOUT_S  # DOCQUEUE_GRAPH_TX_TIMEOUT_S
    conflict_retries: int = CONFLICT_RETRIES  # DOCQUEUE_GRAPH_CONFLICT_RETRIES
    bolt_home: str = ""  # the embedded server's folder, <DOCQUEUE_HOME>/bolt
    bolt_port: int = 0  # DOCQUEUE_BOLT_PORT; 0 = the home's own port
    bolt_heap_mb: int = default(GraphConfig, "bolt_heap_mb")  # DOCQUEUE_BOLT_HEAP_MB
    bolt_java_opts: str = ""  # DOCQUEUE_BOLT_JAVA_OPTS

    @classmethod
    def from_settings(cls, settings: Settings) -> Neo4jResource:
        graph = settings.graph
        return cls(
            uri=graph.uri,
            user=graph.user,
            password=dagster.EnvVar("DOCQUEUE_NEO4J_PASSWORD") if graph.password is not None else "",
            database=graph.database,
            batch_size=graph.batch_size,
            tx_timeout_s=graph.tx_timeout_s,
            conflict_retries=graph.conflict_retries,
            bolt_home=str(bolt_home(settings)),
            bolt_port=graph.bolt_port,
            bolt_heap_mb=graph.bolt_heap_mb,
            bolt_java_opts=graph.bolt_java_opts,
        )

    def connection(self) -> tuple[str, str, str, str | None]:
        if self.uri:
            password = self.password.get_value() if isinstance(self.password, dagster.EnvVar) else self.password
            return self.uri, self.user, password or "", self.database or None
        if not self.bolt_home:
            raise ValueError(
                "Neo4jResource has neither a uri nor a bolt_home: build it with Neo4jResource.from_settings(settings)"
            )
        server = BoltServer(
            Path(self.bolt_home), port=self.bolt_port or None, heap_mb=self.bolt_heap_mb, java_opts=self.bolt_java_opts
        )
        return server.ensure_running(), server.user, server.password, server.database

    def get_store(self) -> GraphStore:
        """A new store (its own driver); the caller closes it (it is a context manager)."""
        uri, user, password, database = self.connection()
        return GraphStore(
            uri,
            user,
            password,
            database,
            batch_size=self.batch_size,
            tx_timeout_s=self.tx_timeout_s,
            conflict_retries=self.conflict_retries,
        )
