"""A home written under the roll-ups' former asset names (`document_ocr`, ...) keeps its partition history:
`docqueue db status` names the former keys that still hold history, and `docqueue db upgrade` moves their
materializations, observations and check evaluations to the current names, once."""

from __future__ import annotations

import json

import dagster as dg

from orchestration.asset_renames import renamed_assets
from orchestration.environment import dagster_instance
from queue_db.config import Settings
from queue_db.phases import PHASES
from tests.cli_runner import docqueue

OLD, NEW = "document_ocr", "ocr_document_rollup"


def test_every_former_name_maps_to_a_current_roll_up():
    assert renamed_assets(PHASES) == {
        "document_ocr": "ocr_document_rollup",
        "document_vector_index": "vector_document_rollup",
        "document_graphrag_index": "graphrag_document_rollup",
    }


def _history_under_former_name(instance: dg.DagsterInstance) -> None:
    instance.add_dynamic_partitions("documents", ["doc-a", "doc-b"])
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=OLD, partition="doc-a", metadata={"pages": 3})
    )
    instance.report_runless_asset_event(
        dg.AssetObservation(asset_key=OLD, partition="doc-b", metadata={"error_class": "empty"})
    )
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(asset_key=dg.AssetKey(OLD), check_name="parents_agree_with_children", passed=True)
    )


def test_db_upgrade_moves_a_renamed_roll_ups_history_once(docqueue_env):
    instance = dagster_instance(Settings.from_env())
    _history_under_former_name(instance)
    assert instance.get_materialized_partitions(dg.AssetKey(OLD)) == {"doc-a"}

    before = docqueue("db", "status", "--json")
    assert before.returncode == 1, before.stderr
    assert json.loads(before.stdout)["dagster"]["former_asset_names"] == [OLD]

    first = docqueue("db", "upgrade", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["renamed_assets_moved"][OLD] == {"renamed_to": NEW, "events": 3}

    new, old = dg.AssetKey(NEW), dg.AssetKey(OLD)
    assert instance.get_materialized_partitions(new) == {"doc-a"}
    [materialization] = instance.fetch_materializations(new, limit=10).records
    assert materialization.asset_materialization.asset_key == new
    assert materialization.asset_materialization.metadata["pages"].value == 3
    [observation] = instance.fetch_observations(new, limit=10).records
    assert observation.partition_key == "doc-b"
    check = dg.AssetCheckKey(new, "parents_agree_with_children")
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([check])
    assert not instance.fetch_materializations(old, limit=10).records
    assert old not in instance.all_asset_keys() and new in instance.all_asset_keys()

    second = docqueue("db", "upgrade", "--json")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["renamed_assets_moved"][OLD]["events"] == 0
    after = docqueue("db", "status", "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    assert json.loads(after.stdout)["dagster"]["former_asset_names"] == []
    assert instance.get_materialized_partitions(new) == {"doc-a"}
