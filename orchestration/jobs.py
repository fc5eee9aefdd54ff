"""One asset job per task asset and roll-up, made from the phase specs: sensors and `docqueue run` launch ranged
runs of these."""

from __future__ import annotations

import dagster as dg

from orchestration.assets.rollups import rollup_asset_name, rollup_run_name
from queue_db.phases import PhaseRegistry


def job_name(run_name: str) -> str:
    return f"{run_name}_job"


def _job(run_name: str, asset_name: str, phase: str) -> dg.UnresolvedAssetJobDefinition:
    # the asset's checks stay out: a task run would plan and skip them every time; the checks job runs them
    return dg.define_asset_job(
        job_name(run_name),
        selection=dg.AssetSelection.assets(asset_name).without_checks(),
        tags={"docqueue/phase": phase},
        description=f"Ranged runs of `{asset_name}` launched by the docqueue sensors and CLI.",
    )


def phase_jobs(phases: PhaseRegistry) -> list[dg.UnresolvedAssetJobDefinition]:
    """Each kind's job (named after the kind, which is its asset's name), then each phase's roll-up job."""
    task_jobs = [_job(kind.name, kind.name, spec.name) for spec in phases for kind in spec.kinds]
    rollup_jobs = [_job(rollup_run_name(spec), rollup_asset_name(spec), spec.name) for spec in phases]
    return [*task_jobs, *rollup_jobs]
