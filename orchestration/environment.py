"""The environment every docqueue process shares: where the queue and Dagster's storage live, and DAGSTER_HOME.

An entry point builds its Settings once and hands them to prepare_environment: with nothing configured that starts
the embedded PostgreSQL and works out its URLs. The variables it sets are the ones Dagster reads itself (DAGSTER_HOME
for the instance, and dagster.yaml's `env:` storage URL) and the ones the webserver, daemon and run workers started
from here inherit, so they all agree without each probing for the server."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestration.dagster_database import check_dagster_storage, dagster_database_url
from queue_db.config import Settings
from queue_db.database_urls import database_url
from queue_db.service_config import ClusterConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_TEMPLATE = REPO_ROOT / "dagster.yaml"


@dataclass(frozen=True)
class PreparedEnvironment:
    """Where this process's queue and Dagster storage are; `variables()` is what Dagster and children read."""

    home: Path
    dagster_home: Path
    queue_url: str
    dagster_url: str

    def variables(self) -> dict[str, str]:
        return {
            "DOCQUEUE_HOME": str(self.home),
            "DOCQUEUE_DATABASE_URL": self.queue_url,
            "DOCQUEUE_DAGSTER_PG_URL": self.dagster_url,
            "DAGSTER_HOME": str(self.dagster_home),
        }


def prepare_environment(settings: Settings) -> PreparedEnvironment:
    """Set DOCQUEUE_DATABASE_URL, DOCQUEUE_DAGSTER_PG_URL and DAGSTER_HOME (with its instance config written) for
    Dagster and the children of this process; returns them."""
    home = settings.database.home_path()
    queue_url = database_url(settings.database)
    dagster_url = dagster_database_url(settings.database, queue_url)
    dagster_home = Path(settings.database.dagster_home or home / "dagster")
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    wanted = instance_yaml(settings.cluster)
    if wanted is not None and (not target.exists() or target.read_text() != wanted):
        target.write_text(wanted)
    prepared = PreparedEnvironment(home, dagster_home, queue_url, dagster_url)
    os.environ.update(prepared.variables())
    enable_event_batches()
    return prepared


INSTANCE_TEMPLATE_ENV, PHASE_LIMITS_ENV = "DOCQUEUE_DAGSTER_YAML", "DOCQUEUE_PHASE_RUN_LIMITS"


def instance_yaml(cluster: ClusterConfig) -> str | None:
    """The instance config written to DAGSTER_HOME: dagster.yaml (or DOCQUEUE_DAGSTER_YAML), its overall run cap
    raised to the sum of DOCQUEUE_PHASE_RUN_LIMITS (`ocr=3,vector=2,graphrag=2`) when set. The per-phase limits
    themselves are the phases' pool limits, kept in Dagster's storage (apply_phase_limits) and so shared by every
    machine of a cluster; in cluster mode a run is one step on one Celery worker slot, so a phase's limit is the
    number of worker slots it may hold at once."""
    configured = cluster.dagster_yaml.strip()
    template = Path(configured or INSTANCE_TEMPLATE)
    if not template.is_file():
        if configured:
            raise ValueError(f"{INSTANCE_TEMPLATE_ENV} names {template}, which is not a file")
        return None
    text = template.read_text()
    limits = phase_run_limits(cluster)
    if not limits:
        return text
    import yaml

    config = yaml.safe_load(text)
    runs = config.setdefault("concurrency", {}).setdefault("runs", {})
    # the overall cap never hides a phase's own limit
    runs["max_concurrent_runs"] = max(int(runs.get("max_concurrent_runs", 0)), sum(limits.values()))
    return f"# written by docqueue from {template} with {PHASE_LIMITS_ENV}\n" + yaml.safe_dump(config, sort_keys=False)


def phase_run_limits(cluster: ClusterConfig) -> dict[str, int]:
    raw = cluster.phase_run_limits.strip()
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


def dagster_instance(settings: Settings):
    """The Dagster instance; DagsterStorageError (one sentence) when its database is missing or unreachable."""
    import dagster as dg

    prepared = prepare_environment(settings)
    check_dagster_storage(prepared.dagster_url)
    instance = dg.DagsterInstance.get()
    apply_phase_limits(instance, phase_run_limits(settings.cluster))
    return instance


def apply_phase_limits(instance, limits: dict[str, int]) -> dict[str, int]:
    """Set each phase's pool limit (DOCQUEUE_PHASE_RUN_LIMITS, parsed by phase_run_limits) in Dagster's storage
    (where `dagster instance concurrency set` puts it); a pool left out keeps dagster.yaml's default of one.
    Returns what changed."""
    changed = {}
    for pool, limit in limits.items():
        if instance.event_log_storage.get_concurrency_info(pool).slot_count != limit:
            instance.event_log_storage.set_concurrency_slots(pool, limit)
            changed[pool] = limit
    return changed
