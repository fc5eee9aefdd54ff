"""The Dagster code location: assets by phase, their jobs, sensors, schedules, checks and resources."""
from __future__ import annotations

from queue_db.config import validate_settings

# before the modules below read settings at import: a bad variable stops the load here, named in one sentence
validate_settings()

import dagster as dg

from orchestration.assets import all_assets
from orchestration.checks import all_checks
from orchestration.cluster import executor_from_env
from orchestration.jobs import all_jobs
from orchestration.schedules import all_schedules, maintenance_jobs
from orchestration.sensors import all_sensors
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.extraction import ExtractionResource
from resources.neo4j import Neo4jResource
from resources.ocr import OcrResource
from resources.qdrant import QdrantResource
from resources.storage import StorageResource
from orchestration.environment import enable_event_batches

# run workers launched by a daemon the docqueue CLI did not start still store event batches in one INSERT
enable_event_batches()


def build_resources() -> dict:
    # every field left empty reads its DOCQUEUE_* environment variable at run time: no secret enters run config
    return {
        "database": DatabaseResource(), "storage": StorageResource(), "ocr": OcrResource(),
        "embeddings": EmbeddingResource(), "qdrant": QdrantResource(), "neo4j": Neo4jResource(),
        "extraction": ExtractionResource(),
    }


defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    jobs=[*all_jobs, *maintenance_jobs],
    sensors=all_sensors,
    schedules=all_schedules,
    resources=build_resources(),
    # DOCQUEUE_EXECUTOR=celery: every job's steps (the sensors' ranged runs, UI backfills of the implicit asset
    # job, maintenance) run on Celery workers; unset, Dagster's default executor runs them in the run's process
    executor=executor_from_env(),
)
