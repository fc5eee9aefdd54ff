"""Fixtures of the reliability suite: a docqueue environment with short, test-sized timeouts."""
from __future__ import annotations

import pytest

# seconds; STALE_TASK_TIMEOUT must comfortably exceed HEARTBEAT_INTERVAL on a loaded 2-core machine
FAST_SETTINGS = {
    "STALE_TASK_TIMEOUT": "2", "HEARTBEAT_INTERVAL": "0.5", "MAX_TASK_RETRIES": "3",
    "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2", "DOCQUEUE_RETRY_BACKOFF_MAX": "1",
    "DOCQUEUE_QDRANT_LOCK_TIMEOUT": "60", "DOCQUEUE_OCR_DPI": "150",
}


@pytest.fixture
def rel_env(docqueue_env, monkeypatch):
    for name, value in FAST_SETTINGS.items():
        monkeypatch.setenv(name, value)
    yield docqueue_env


class Pipeline:
    """The test's handle on its environment: the queue, the Dagster instance and intake, in-process."""

    def __init__(self, tmp_path):
        from orchestration.definitions import defs
        from orchestration.environment import dagster_instance
        from resources.database import get_queue
        from resources.storage import StorageResource

        self.defs, self.instance, self.queue = defs, dagster_instance(), get_queue()
        self.storage = StorageResource().get_storage()
        self.tmp = tmp_path

    def reload_settings(self) -> None:
        """A new queue handle that reads the (monkeypatched) queue settings again."""
        from resources.database import get_queue

        self.queue = get_queue()

    def ingest(self, paths, **kwargs):
        from orchestration.intake import ingest_paths
        from orchestration.partitions import register_partitions
        from queue_db.tasks import Level

        results = ingest_paths(self.queue, self.storage, paths, **kwargs)
        register_partitions(self.instance, self.queue.engine, Level.DOCUMENT)
        return results

    def run_until_idle(self, max_seconds: float = 240.0, **kwargs):
        from orchestration.runner import run_until_idle

        return run_until_idle(self.defs, self.instance, self.queue, until_idle=True, poll_s=0.3,
                              max_seconds=max_seconds, **kwargs)


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
