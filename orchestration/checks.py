"""Asset checks: nothing stuck in processing, documents expanded or failed with a reason, parents agree with
children, stores agree with the queue.

Each check is a spec of orchestration.check_evaluations, on an asset of the phase specs. Made into a Dagster asset
check here, it evaluates the whole corpus: that is what the nightly `asset_checks` schedule runs. Each roll-up that
wrote something evaluates its phase's checks for its own documents as well (assets.rollups), so the Checks tab
shows every check evaluated within a day of any change."""

import dagster as dg
from dagster import AssetCheckExecutionContext

from orchestration.assets.rollups import rollup_asset_name
from orchestration.check_evaluations import CheckSpec, phase_check_specs
from queue_db.config import Settings
from queue_db.phases import PhaseRegistry

POOL = "maintenance"


def _asset_check(spec: CheckSpec, page_size: int) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        pool=POOL,
        asset=spec.asset,
        name=spec.name,
        blocking=False,
        description=spec.description,
        required_resource_keys=set(spec.resources),
    )
    def check(context: AssetCheckExecutionContext) -> dg.AssetCheckResult:
        passed, metadata = spec.evaluate(context.resources, None, page_size)
        return dg.AssetCheckResult(passed=passed, metadata=metadata)

    return check


def phase_checks(settings: Settings, phases: PhaseRegistry) -> list[dg.AssetChecksDefinition]:
    page_size = settings.dagster.verify_page
    return [_asset_check(spec, page_size) for spec in phase_check_specs(phases, rollup_asset_name)]


def checks_job() -> "dg.UnresolvedAssetJobDefinition":
    """Every check, and nothing else: what the checks schedule runs (results show on each asset's Checks tab)."""
    return dg.define_asset_job(
        "asset_checks_job",
        selection=dg.AssetSelection.all_asset_checks(),
        tags={"docqueue/phase": "maintenance"},
        description="Evaluates every asset check over the whole corpus: nothing stuck, documents expanded or failed "
        "with a reason, parents agree with children, stores agree with the queue.",
    )
