"""The environment every docqueue process shares: where the queue and Dagster's storage live, and DAGSTER_HOME.

With nothing configured this starts the embedded PostgreSQL once and exports its URLs, so the webserver, daemon,
run workers and CLI all agree without each probing for the server."""
from __future__ import annotations

import os
from pathlib import Path

from queue_db.config import docqueue_home
from queue_db.server import dagster_database_url, database_url

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_TEMPLATE = REPO_ROOT / "dagster.yaml"


def prepare_environment() -> dict[str, str]:
    """Export DOCQUEUE_DATABASE_URL, DOCQUEUE_DAGSTER_PG_URL and DAGSTER_HOME; returns them (URLs redacted)."""
    os.environ["DOCQUEUE_HOME"] = str(docqueue_home())
    os.environ["DOCQUEUE_DATABASE_URL"] = database_url()
    os.environ["DOCQUEUE_DAGSTER_PG_URL"] = dagster_database_url()
    home = Path(os.environ.get("DAGSTER_HOME") or docqueue_home() / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    wanted = instance_yaml()
    if wanted is not None and (not target.exists() or target.read_text() != wanted):
        target.write_text(wanted)
    os.environ["DAGSTER_HOME"] = str(home)
    enable_event_batches()
    return {"DOCQUEUE_HOME": os.environ["DOCQUEUE_HOME"], "DAGSTER_HOME": str(home),
            "DOCQUEUE_DATABASE_URL": redact(os.environ["DOCQUEUE_DATABASE_URL"]),
            "DOCQUEUE_DAGSTER_PG_URL": redact(os.environ["DOCQUEUE_DAGSTER_PG_URL"])}


INSTANCE_TEMPLATE_ENV, PHASE_LIMITS_ENV = "DOCQUEUE_DAGSTER_YAML", "DOCQUEUE_PHASE_RUN_LIMITS"


def instance_yaml() -> str | None:
    """The instance config written to DAGSTER_HOME: dagster.yaml (or DOCQUEUE_DAGSTER_YAML), with the per-phase
    run limits of DOCQUEUE_PHASE_RUN_LIMITS (`ocr=3,vector=2,graphrag=2`) when set. In cluster mode a run is
    one step on one Celery worker slot, so a phase's limit is the number of worker slots it may hold at once."""
    template = Path(os.environ.get(INSTANCE_TEMPLATE_ENV, "").strip() or INSTANCE_TEMPLATE)
    if not template.is_file():
        if os.environ.get(INSTANCE_TEMPLATE_ENV, "").strip():
            raise ValueError(f"{INSTANCE_TEMPLATE_ENV} names {template}, which is not a file")
        return None
    text = template.read_text()
    limits = phase_run_limits()
    if not limits:
        return text
    import yaml

    config = yaml.safe_load(text)
    runs = config.setdefault("concurrency", {}).setdefault("runs", {})
    entries = runs.setdefault("tag_concurrency_limits", [])
    known = {entry.get("value"): entry for entry in entries if entry.get("key") == "docqueue/phase"}
    for phase, limit in limits.items():
        if phase in known:
            known[phase]["limit"] = limit
        else:
            entries.append({"key": "docqueue/phase", "value": phase, "limit": limit})
    # the overall cap never hides a phase's own limit
    runs["max_concurrent_runs"] = max(int(runs.get("max_concurrent_runs", 0)),
                                      sum(e["limit"] for e in entries if e.get("key") == "docqueue/phase"))
    return f"# written by docqueue from {template} with {PHASE_LIMITS_ENV}\n" + yaml.safe_dump(config, sort_keys=False)


def phase_run_limits() -> dict[str, int]:
    raw = os.environ.get(PHASE_LIMITS_ENV, "").strip()
    limits: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        phase, _, value = item.partition("=")
        if not value.strip().isdigit() or int(value) < 1 or not phase.strip():
            raise ValueError(f"{PHASE_LIMITS_ENV} takes phase=limit pairs such as `ocr=3,vector=2`, got {item!r}")
        limits[phase.strip()] = int(value)
    return limits


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
    import dagster as dg

    prepare_environment()
    return dg.DagsterInstance.get()
