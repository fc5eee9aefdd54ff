"""The environment every docqueue process shares: where the queue and Dagster's storage live, and DAGSTER_HOME.

With nothing configured this starts the embedded PostgreSQL once and exports its URLs, so the webserver, daemon,
run workers and CLI all agree without each probing for the server."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from queue_db.config import docqueue_home
from queue_db.database_urls import database_url
from orchestration.dagster_storage import dagster_database_url

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_TEMPLATE = REPO_ROOT / "dagster.yaml"


def prepare_environment() -> dict[str, str]:
    """Export DOCQUEUE_DATABASE_URL, DOCQUEUE_DAGSTER_PG_URL and DAGSTER_HOME; returns them (URLs redacted)."""
    # exported, not only read: the webserver, daemon and run workers started from here inherit them
    queue_url, dagster_url = database_url(), dagster_database_url()
    os.environ.update({"DOCQUEUE_HOME": str(docqueue_home()), "DOCQUEUE_DATABASE_URL": queue_url,
                       "DOCQUEUE_DAGSTER_PG_URL": dagster_url})
    # Dagster's own variable: where its instance lives
    home = Path(os.environ.get("DAGSTER_HOME") or docqueue_home() / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if INSTANCE_TEMPLATE.exists() and (not target.exists() or target.read_text() != INSTANCE_TEMPLATE.read_text()):
        shutil.copyfile(INSTANCE_TEMPLATE, target)
    os.environ["DAGSTER_HOME"] = str(home)
    enable_event_batches()
    return {"DOCQUEUE_HOME": str(docqueue_home()), "DAGSTER_HOME": str(home),
            "DOCQUEUE_DATABASE_URL": redact(queue_url), "DOCQUEUE_DAGSTER_PG_URL": redact(dagster_url)}


# Events Dagster marks as one batch (a run's planned partitions, our per-partition materializations) are stored
# with one multi-row INSERT when this is above 0 (Dagster's own default is 0: one INSERT per event). Children
# (webserver, daemon, run workers) inherit it; orchestration.definitions sets it too, for processes started
# without the docqueue CLI.
EVENT_BATCH_SIZE_ENV = "DAGSTER_EVENT_BATCH_SIZE"
DEFAULT_EVENT_BATCH_SIZE = "500"


def enable_event_batches() -> None:
    os.environ.setdefault(EVENT_BATCH_SIZE_ENV, DEFAULT_EVENT_BATCH_SIZE)


def redact(url: str) -> str:
    """user:password@host -> user:***@host, for anything shown to a person."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    if ":" in credentials:
        credentials = credentials.split(":", 1)[0] + ":***"
    return f"{scheme}://{credentials}@{host}"


def dagster_instance():
    """The Dagster instance; DagsterStorageError (one sentence) when its database is missing or unreachable."""
    import dagster as dg

    from orchestration.dagster_storage import check_dagster_storage

    prepare_environment()
    check_dagster_storage(os.environ["DOCQUEUE_DAGSTER_PG_URL"])
    return dg.DagsterInstance.get()
