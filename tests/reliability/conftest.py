"""Fixtures of the reliability suite: a docqueue environment with short, test-sized timeouts."""

from __future__ import annotations

import pytest

# seconds; STALE_TASK_TIMEOUT must comfortably exceed HEARTBEAT_INTERVAL on a loaded 2-core machine
FAST_SETTINGS = {
    "STALE_TASK_TIMEOUT": "2",
    "HEARTBEAT_INTERVAL": "0.5",
    "MAX_TASK_RETRIES": "3",
    "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2",
    "DOCQUEUE_RETRY_BACKOFF_MAX": "1",
    "DOCQUEUE_QDRANT_LOCK_TIMEOUT": "60",
    "DOCQUEUE_OCR_DPI": "150",
}


@pytest.fixture
def rel_env(docqueue_env, monkeypatch):
    for name, value in FAST_SETTINGS.items():
        monkeypatch.setenv(name, value)
    yield docqueue_env


class Pipeline:
    """The test's handle on its environment: the queue, the Dagster instance and intake, in-process."""

    def __init__(self, tmp_path):
        from orchestration.code_location import build_definitions
        from queue_db.config import Settings as _Settings

        # built here, with this test's environment: the resources carry its home and stores
        defs = build_definitions(_Settings.from_env())
        from orchestration.environment import dagster_instance
        from queue_db.config import Settings
        from resources.database import open_queue
        from resources.storage_resource import StorageResource

        self.defs, self.instance = defs, dagster_instance(Settings.from_env())
        self.queue = open_queue(Settings.from_env())
        self.storage = StorageResource.from_settings(Settings.from_env()).get_storage()
        self.tmp = tmp_path

    def reload_settings(self) -> None:
        """The definitions and a queue handle built again from the (monkeypatched) environment."""
        from orchestration.code_location import build_definitions
        from queue_db.config import Settings
        from resources.database import open_queue

        self.defs = build_definitions(Settings.from_env())
        self.queue = open_queue(Settings.from_env())

    def ingest(self, paths, **kwargs):
        from orchestration.intake import IntakeRules, ingest_paths
        from orchestration.partitions import register_partitions
        from queue_db.config import Settings
        from queue_db.phases import Level

        kwargs.setdefault("rules", IntakeRules.from_settings(Settings.from_env()))
        results = ingest_paths(self.queue, self.storage, paths, **kwargs)
        register_partitions(self.instance, self.queue.engine, Level.DOCUMENT)
        return results

    def run_until_idle(self, max_seconds: float = 240.0, **kwargs):
        from orchestration.runner import run_until_idle
        from queue_db.config import Settings

        return run_until_idle(
            self.defs,
            self.instance,
            self.queue,
            settings=Settings.from_env(),
            until_idle=True,
            poll_s=0.3,
            max_seconds=max_seconds,
            **kwargs,
        )


@pytest.fixture
def pipeline(rel_env, tmp_path):
    handle = Pipeline(tmp_path)
    yield handle
    handle.instance.dispose()


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """Forks ready-imported worker processes; shared by the session (each worker gets the test's environment)."""
    from tests.reliability.support import Zygote

    parent = Zygote(tmp_path_factory.mktemp("zygote"))
    try:
        yield parent.wait_ready()
    finally:
        parent.close()


@pytest.fixture(scope="module")
def module_env(tmp_path_factory, create_database, migrated_template, bolt_server):
    """docqueue_env for a whole module (an expensive run processed once, then checked by several tests): its own
    queue and Dagster databases, DOCQUEUE_HOME and DAGSTER_HOME, an emptied graph, and FAST_SETTINGS."""
    from orchestration.environment import prepare_environment
    from queue_db.config import Settings
    from tests.conftest import DocqueueEnv
    from tests.integration.bolt_fixture import clean_graph

    home = tmp_path_factory.mktemp("module") / "home"
    queue_url = create_database(template=migrated_template)
    dagster_url = create_database(prefix="dagster")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "DOCQUEUE_HOME": str(home),
            "DOCQUEUE_DATABASE_URL": queue_url,
            "DOCQUEUE_DAGSTER_PG_URL": dagster_url,
            "DAGSTER_HOME": str(home / "dagster"),
            "DOCQUEUE_NEO4J_URI": bolt_server.uri,
            "DOCQUEUE_NEO4J_USER": bolt_server.user,
            "DOCQUEUE_NEO4J_PASSWORD": bolt_server.password,
            "DOCQUEUE_QDRANT_PATH": str(home / "qdrant"),
            "DOCQUEUE_QDRANT_URL": "",
            **FAST_SETTINGS,
        }.items():
            patch.setenv(name, value)
        if bolt_server.database:
            patch.setenv("DOCQUEUE_NEO4J_DATABASE", bolt_server.database)
        clean_graph(bolt_server)
        prepare_environment(Settings.from_env())
        yield DocqueueEnv(home, queue_url, dagster_url, bolt_server), patch


@pytest.fixture
def say(request):
    """say(text): printed past pytest's capture (the figures the closing note needs)."""
    from tests.reliability.support import announce

    return lambda text: announce(request, text)


@pytest.fixture(scope="session", autouse=True)
def closing_figures(request):
    """At the end of the session: the totals of every fault test's figures."""
    yield
    from tests.reliability.support import announce, totals_line

    line = totals_line()
    if line:
        announce(request, line)
