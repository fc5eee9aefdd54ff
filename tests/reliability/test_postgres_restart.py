"""PostgreSQL restarted while runs are active: the worker and the sensors reconnect and carry on; every document
completes and nothing is lost or duplicated. Runs on a PostgreSQL server of its own (the session's is shared)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

import dagster as dg
import pytest

from queue_db.phases import ALL_KINDS
from tests import pdf_factory as pf
from tests.reliability.support import Stores, document_statuses, figures_line, processing_ids, store_figures, wait_for

ALL_COMPLETED = ("completed", "completed", "completed")
OUTAGE_S = 3.0  # longer than the queue's own retries of a statement (~1.5 s): the callers must cope


def _free_port(start: int) -> int:
    for port in range(start, start + 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


@pytest.fixture
def own_postgres(rel_env, monkeypatch):
    from queue_db.embedded_postgres import EmbeddedPostgres
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    home = Path(tempfile.mkdtemp(prefix="docqueue-restart-pg-"))  # not under pytest's 0700 basetemp
    server = EmbeddedPostgres(
        home,
        port=_free_port(56100),
        extra_settings={"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
    )
    queue_url = server.ensure_running()
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    monkeypatch.setenv("DOCQUEUE_DATABASE_URL", queue_url)
    monkeypatch.setenv(
        "DOCQUEUE_DAGSTER_PG_URL", server.url("dagster").replace("postgresql+psycopg://", "postgresql://")
    )
    try:
        yield server
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(home, ignore_errors=True)


def _inbox_tick(pipeline, inbox: Path) -> str:
    from orchestration.sensors import inbox_sensor
    from queue_db.config import Settings
    from resources.database import DatabaseResource
    from resources.storage_resource import StorageResource

    context = dg.build_sensor_context(
        instance=pipeline.instance,
        resources={
            "database": DatabaseResource.from_settings(Settings.from_env()),
            "storage": StorageResource.from_settings(Settings.from_env()),
        },
    )
    return inbox_sensor(Settings.from_env()).evaluate_tick(context).skip_message or ""


def test_postgres_restart_mid_run_loses_nothing(own_postgres, zygote, tmp_path, monkeypatch, say):
    from tests.reliability.conftest import Pipeline

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    pipeline = Pipeline(tmp_path)
    queue = pipeline.queue
    bees, volcanoes = pf.two_topic_pdfs(inbox)
    pf.text_pdf(inbox, "report.pdf", [pf.DEMO_PAGE, ["# Staff", "Ada Lovelace met Charles Babbage in London."]])
    assert "3 new" in _inbox_tick(pipeline, inbox)
    worker = zygote.spawn("restart", tmp_path, slow_kinds=[kind.name for kind in ALL_KINDS], slow_s=0.3)
    outages = []
    for phase_kinds in (ALL_KINDS[:2], ALL_KINDS[3:]):  # once while OCR runs, once while chunks are processed
        wait_for(lambda: _any_processing(queue, phase_kinds), 120, 0.02, "work in progress")
        stopped_at = time.monotonic()
        own_postgres.stop(mode="fast")  # every connection is cut
        time.sleep(OUTAGE_S)  # new connections are refused meanwhile
        own_postgres.ensure_running()
        outages.append(time.monotonic() - stopped_at)

    # the sensors reconnect: a file dropped after the restart is registered by the next tick
    pf.text_pdf(inbox, "after-restart.pdf", [pf.TWO_TOPICS["beekeeping"][:2]])
    assert "1 new" in _inbox_tick(pipeline, inbox)

    report = worker.finish(240)
    pipeline.run_until_idle()  # anything registered after the worker went idle
    statuses = document_statuses(queue)
    assert len(statuses) == 4 and set(statuses.values()) == {ALL_COMPLETED}, statuses
    stores = Stores.open()
    try:
        figures = store_figures(queue, stores)
    finally:
        stores.close()
    assert figures["verify"]["consistent"], figures["verify"]
    assert figures["points"] == figures["chunks"] > 0 and set(figures["duplicates"].values()) == {0}
    say(
        figures_line(
            "postgres restart",
            {
                "faults": len(outages),
                "outages_s": "/".join(f"{o:.1f}" for o in outages),
                "worker_runs": report["runs"],
                "failed_runs": report["failed_runs"],
                "documents": len(statuses),
                "tasks_lost": 0,
                "duplicates": 0,
            },
        )
    )
    pipeline.instance.dispose()


def _any_processing(queue, kinds) -> bool:
    import sqlalchemy as sa

    try:
        return any(processing_ids(queue, kind) for kind in kinds)
    except sa.exc.OperationalError:  # the test's own poll may hit the restart; the workers' calls must not fail
        return False
