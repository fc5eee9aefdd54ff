"""One asset job per task asset and roll-up: sensors and `docqueue run` launch ranged runs of these."""
from __future__ import annotations

import dagster as dg

from queue_db.phases import ALL_KINDS
from orchestration.assets.rollups import ROLLUP_ASSET_BY_PHASE

ASSET_OF_KIND = {kind.name: kind.name for kind in ALL_KINDS}  # each task kind's asset carries its name
PHASE_OF_KIND = {kind.name: kind.phase.value for kind in ALL_KINDS}


def job_name(run_name: str) -> str:
    return f"{run_name}_job"


def _job(run_name: str, asset_name: str, phase: str) -> dg.UnresolvedAssetJobDefinition:
    # the asset's checks stay out: a task run would plan and skip them every time; the checks job runs them
    return dg.define_asset_job(job_name(run_name), selection=dg.AssetSelection.assets(asset_name).without_checks(),
                               tags={"docqueue/phase": phase},
                               description=f"Ranged runs of `{asset_name}` launched by the docqueue sensors and CLI.")


task_jobs = [_job(kind.name, kind.name, kind.phase.value) for kind in ALL_KINDS]
rollup_jobs = [_job(f"rollup_{phase}", asset, phase) for phase, asset in ROLLUP_ASSET_BY_PHASE.items()]
all_jobs = [*task_jobs, *rollup_jobs]
