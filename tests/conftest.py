"""Shared fixtures: a real PostgreSQL for the whole session (the embedded server, or DOCQUEUE_TEST_PG_ADMIN_URL),
a migrated template database, and a fresh clone of it per test."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from queue_db.config import QueueSettings
from queue_db.database_urls import libpq_url
from queue_db.migrate import upgrade
from queue_db.queue import TaskQueue, create_queue_engine
from tests.figures import FILE_KEY as FIGURES_KEY
from tests.figures import collected

pytest_plugins = ["tests.integration.bolt_fixture", "tests.s3_fixture"]

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = Path(os.environ.get("DOCQUEUE_CORPUS", REPO_ROOT.parent / "shared" / "corpus"))


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory) -> str:
    """Admin URL (database `postgres`) of a real server the tests may create databases on."""
    configured = os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL")
    if configured:
        yield libpq_url(configured)
        return
    from queue_db.embedded_postgres import EmbeddedPostgres

    # not under pytest's basetemp: pytest resets it to mode 0700, which locks out the server's own user
    home = Path(tempfile.mkdtemp(prefix="docqueue-test-pg-"))
    # durability settings off: a test database is thrown away, and fsync costs most of the test time
    # a free port: several checkouts of the project may run their suites side by side
    server = EmbeddedPostgres(
        home,
        port=_free_port(),
        extra_settings={
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "300",
        },
    )
    server.ensure_running()
    yield f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    server.stop(mode="immediate")
    # hundreds of test databases are gigabytes in ~100,000 files: removed by a process of its own, so the run
    # ends without waiting for it
    subprocess.Popen(["rm", "-rf", str(home)], start_new_session=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _with_database(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="session")
def create_database(pg_admin_url):
    """Factory: create an empty (or templated) database; all are dropped at the end of the session (with the
    embedded server, by removing it)."""
    created: list[str] = []

    def factory(template: str | None = None, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        created.append(name)
        return _with_database(pg_admin_url, name)

    yield factory
    if not os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL"):
        # the embedded server goes whole with its folder; a DROP DATABASE each (0.2 s apiece, a checkpoint each)
        # would cost minutes at the end of a full run
        return
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def migrated_template(create_database) -> str:
    url = create_database(prefix="template")
    engine = create_queue_engine(url)
    upgrade(engine)
    engine.dispose()
    return url.rsplit("/", 1)[1]


@pytest.fixture
def database_url(create_database, migrated_template) -> str:
    """A freshly migrated database of its own for one test (a copy of the template: ~0.1 s)."""
    return create_database(template=migrated_template)


@pytest.fixture
def engine(database_url):
    engine = create_queue_engine(database_url, pool_size=4, max_overflow=8)
    yield engine
    engine.dispose()


@pytest.fixture
def settings() -> QueueSettings:
    return QueueSettings(
        heartbeat_interval_s=0.2, stale_timeout_s=2.0, max_retries=3, retry_backoff_base_s=0.0, retry_backoff_max_s=0.0
    )


@pytest.fixture
def queue(engine, settings) -> TaskQueue:
    return TaskQueue(engine, settings)


# the order modules start in under `-n 2 --dist loadfile --no-loadscope-reorder` (test.sh): the end-to-end modules
# that run for minutes first, the many short ones last, where they fill in while the other process ends its module
# (xdist's default order, most tests first, started the single-test modules of several minutes last)
_FOLDER_ORDER = {"acceptance": 1, "reliability": 1, "integration": 2, "unit": 3}


def _start_order(item) -> tuple[int, int]:
    folder = item.path.parent.name
    slow = item.get_closest_marker("slow") is not None
    return (0 if slow else 1, _FOLDER_ORDER.get(folder, 2))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_order)  # stable: a module's tests keep their order
    # speed is measured on demand, not asserted in every run of the suite
    if os.environ.get("DOCQUEUE_SCALE_TESTS") != "1":
        skip_scale = pytest.mark.skip(reason="scale measurement: set DOCQUEUE_SCALE_TESTS=1 to run it")
        for item in items:
            if "scale" in item.keywords:
                item.add_marker(skip_scale)
    if CORPUS_DIR.is_dir():
        return
    skip = pytest.mark.skip(reason=f"corpus folder {CORPUS_DIR} not present")
    for item in items:
        if "corpus" in item.keywords:
            item.add_marker(skip)


@dataclass
class DocqueueEnv:
    home: Path
    queue_url: str
    dagster_url: str
    bolt: object


@pytest.fixture
def docqueue_env(tmp_path, monkeypatch, create_database, migrated_template, bolt_server) -> DocqueueEnv:
    """A complete, isolated docqueue environment for one test: its own queue and Dagster databases on the
    session's PostgreSQL, its own DOCQUEUE_HOME (storage, embedded Qdrant) and DAGSTER_HOME, and an emptied
    graph on the session's Bolt server. Subprocesses started by the test inherit it through the environment."""
    from orchestration.environment import prepare_environment
    from queue_db.config import Settings
    from tests.integration.bolt_fixture import clean_graph

    home = tmp_path / "home"
    queue_url = create_database(template=migrated_template)
    dagster_url = create_database(prefix="dagster")
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
    }.items():
        monkeypatch.setenv(name, value)
    if bolt_server.database:
        monkeypatch.setenv("DOCQUEUE_NEO4J_DATABASE", bolt_server.database)
    clean_graph(bolt_server)
    prepare_environment(Settings.from_env())
    yield DocqueueEnv(home, queue_url, dagster_url, bolt_server)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, in the controlling process: every worker appends its figures to one file (tests/figures.py)."""
    node.workerinput[FIGURES_KEY] = str(_figures_file(node.config))


def _figures_file(config) -> Path:
    if not hasattr(config, "_docqueue_figures"):
        handle, name = tempfile.mkstemp(prefix="docqueue-figures-", suffix=".txt")
        os.close(handle)
        config._docqueue_figures = Path(name)
    return config._docqueue_figures


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not hasattr(config, "_docqueue_figures"):
        return
    text = collected(config._docqueue_figures)
    config._docqueue_figures.unlink(missing_ok=True)
    if text:
        terminalreporter.section("figures the tests printed")
        terminalreporter.write(text)
