"""The assets of the code location, made from the phase specs: one per task kind, one roll-up per phase."""

from __future__ import annotations

from typing import Mapping

import dagster as dg

from orchestration.assets.handlers import PhaseHandler
from orchestration.assets.rollups import rollup_assets
from orchestration.assets.tasks import task_assets
from orchestration.task_outcomes import PageLimits
from queue_db.config import NearDuplicateConfig
from queue_db.phases import PhaseRegistry


def phase_assets(
    phases: PhaseRegistry,
    handlers: Mapping[str, PhaseHandler],
    limits: PageLimits = PageLimits(),
    near_duplicates: NearDuplicateConfig | None = None,
) -> list[dg.AssetsDefinition]:
    return [*task_assets(phases, handlers, limits), *rollup_assets(phases, near_duplicates)]
