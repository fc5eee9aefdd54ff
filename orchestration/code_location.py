"""The Dagster definitions of docqueue, made from the settings and the phase specs.

`build_definitions(settings, phases, handlers)` makes everything: per task kind of every phase its asset, job and
sensor; per phase its roll-up asset, job and sensor; the checks on the phases' assets; the intake sensors, the
maintenance jobs and schedules, the resources and the executor. Each phase's pool, Celery queue, group and tags
come from its spec; the work of its kinds from the handler its spec names (assets.handlers.HANDLERS).
orchestration.definitions builds the code location's own from the environment; `docqueue run`, the benches and
the tests build theirs with their settings.
"""

from __future__ import annotations

from typing import Mapping

import dagster as dg

from orchestration.assets import phase_assets
from orchestration.assets.handlers import HANDLERS, PhaseHandler
from orchestration.checks import checks_job, phase_checks
from orchestration.cluster import executor_for
from orchestration.jobs import phase_jobs
from orchestration.schedules import maintenance_jobs, maintenance_schedules, recovery_sensor
from orchestration.sensors import intake_sensors, phase_sensors
from orchestration.task_outcomes import PageLimits
from queue_db.config import Settings
from queue_db.phases import PHASES, PhaseRegistry
from resources.database import DatabaseResource
from resources.embedding_resource import EmbeddingResource
from resources.extraction import ExtractionResource
from resources.graph_stores import Neo4jResource
from resources.ocr_resource import OcrResource
from resources.storage_resource import StorageResource
from resources.vector_resource import QdrantResource


def build_resources(settings: Settings) -> dict:
    """Every resource with its fields from `settings`; secrets stay `dg.EnvVar` fields, so no secret enters code or
    run config."""
    return {
        "database": DatabaseResource.from_settings(settings),
        "storage": StorageResource.from_settings(settings),
        "ocr": OcrResource.from_settings(settings),
        "embeddings": EmbeddingResource.from_settings(settings),
        "qdrant": QdrantResource.from_settings(settings),
        "neo4j": Neo4jResource.from_settings(settings),
        "extraction": ExtractionResource.from_settings(settings),
    }


def build_definitions(
    settings: Settings, phases: PhaseRegistry = PHASES, handlers: Mapping[str, PhaseHandler] = HANDLERS
) -> dg.Definitions:
    maintenance = maintenance_jobs(settings)
    checks = checks_job()
    return dg.Definitions(
        assets=phase_assets(phases, handlers, PageLimits.from_config(settings.storage), settings.near_duplicates),
        asset_checks=phase_checks(settings, phases),
        jobs=[*phase_jobs(phases), maintenance.recovery, maintenance.reconciliation, checks],
        sensors=[*intake_sensors(settings), *phase_sensors(settings, phases), recovery_sensor(settings, maintenance)],
        schedules=maintenance_schedules(settings, maintenance, checks),
        resources=build_resources(settings),
        # DOCQUEUE_EXECUTOR=celery: every job's steps (the sensors' ranged runs, UI backfills of the implicit asset
        # job, maintenance) run on Celery workers; unset, in the run's own process
        executor=executor_for(settings.cluster),
    )
