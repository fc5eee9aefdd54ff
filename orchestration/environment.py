"""The environment every docqueue process shares: where the queue and Dagster's storage live, and DAGSTER_HOME.

With nothing configured this starts the embedded PostgreSQL once and exports its URLs, so the webserver, daemon,
run workers and CLI all agree without each probing for the server."""
from __future__ import annotations

import os
from pathlib import Path

from queue_db.config import ClusterConfig, docqueue_home, settings
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
    wanted = instance_yaml()
    if wanted is not None and (not target.exists() or target.read_text() != wanted):
        target.write_text(wanted)
    os.environ["DAGSTER_HOME"] = str(home)
    enable_event_batches()
    return {"DOCQUEUE_HOME": str(docqueue_home()), "DAGSTER_HOME": str(home),
            "DOCQUEUE_DATABASE_URL": redact(queue_url), "DOCQUEUE_DAGSTER_PG_URL": redact(dagster_url)}


INSTANCE_TEMPLATE_ENV, PHASE_LIMITS_ENV = "DOCQUEUE_DAGSTER_YAML", "DOCQUEUE_PHASE_RUN_LIMITS"


def instance_yaml() -> str | None:
    """The instance config written to DAGSTER_HOME: dagster.yaml (or DOCQUEUE_DAGSTER_YAML), its overall run cap
    raised to the sum of DOCQUEUE_PHASE_RUN_LIMITS (`ocr=3,vector=2,graphrag=2`) when set. The per-phase limits
    themselves are the phases' pool limits, kept in Dagster's storage (apply_phase_limits) and so shared by every
    machine of a cluster; in cluster mode a run is one step on one Celery worker slot, so a phase's limit is the
    number of worker slots it may hold at once."""
    configured = settings(ClusterConfig).dagster_yaml.strip()
    template = Path(configured or INSTANCE_TEMPLATE)
    if not template.is_file():
        if configured:
            raise ValueError(f"{INSTANCE_TEMPLATE_ENV} names {template}, which is not a file")
        return None
    text = template.read_text()
    limits = phase_run_limits()
    if not limits:
        return text
    import yaml

    config = yaml.safe_load(text)
    runs = config.setdefault("concurrency", {}).setdefault("runs", {})
    # the overall cap never hides a phase's own limit
    runs["max_concurrent_runs"] = max(int(runs.get("max_concurrent_runs", 0)), sum(limits.values()))
    return f"# written by docqueue from {template} with {PHASE_LIMITS_ENV}\n" + yaml.safe_dump(config, sort_keys=False)


def phase_run_limits() -> dict[str, int]:
    raw = settings(ClusterConfig).phase_run_limits.strip()
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
    """The Dagster instance; DagsterStorageError (one sentence) when its database is missing or unreachable."""
    import dagster as dg

    from orchestration.dagster_storage import check_dagster_storage

    prepare_environment()
    check_dagster_storage(os.environ["DOCQUEUE_DAGSTER_PG_URL"])
    instance = dg.DagsterInstance.get()
    apply_phase_limits(instance)
    return instance


def apply_phase_limits(instance) -> dict[str, int]:
    """Set each phase's pool limit from DOCQUEUE_PHASE_RUN_LIMITS in Dagster's storage (where `dagster instance
    concurrency set` puts it); a pool left out keeps dagster.yaml's default of one. Returns what changed."""
    changed = {}
    for pool, limit in phase_run_limits().items():
        if instance.event_log_storage.get_concurrency_info(pool).slot_count != limit:
            instance.event_log_storage.set_concurrency_slots(pool, limit)
            changed[pool] = limit
    return changed
