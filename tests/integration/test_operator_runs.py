"""What the operator sees of a corpus with a file that can never succeed: every check evaluated by the roll-ups
that changed something, one failure per failure (a re-run of the unfixable file fails once and launches no
roll-up), runs tagged in words, and a failed batch leaving no summary that reads like success."""

from __future__ import annotations

import dagster as dg
import pytest

from tests import pdf_factory as pf

RANGE_TAG, PROCESS_TAG, KIND_TAG = "docqueue/range", "docqueue/process", "docqueue/kind"


@pytest.fixture
def processed(docqueue_env, tmp_path):
    """A handbook and an encrypted PDF without its password, ingested and run until idle in-process."""
    from orchestration.code_location import build_definitions
    from orchestration.environment import dagster_instance
    from orchestration.intake import ingest_file
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.storage import StorageResource

    settings = Settings.from_env()
    queue = open_queue(settings)
    storage = StorageResource.from_settings(settings).get_storage()
    good = pf.text_pdf(tmp_path, "handbook.pdf", [["# Handbook", "Grace Hopper joined the Navy in New York."]])
    broken = pf.encrypted_pdf(tmp_path, "locked.pdf", "secret")
    keys = {name: ingest_file(queue, storage, path).document_key for name, path in (("good", good), ("bad", broken))}
    defs = build_definitions(settings)
    instance = dagster_instance(settings)
    run_until_idle(defs, instance, queue, settings=settings, until_idle=True, max_seconds=240)
    yield defs, instance, queue, keys
    instance.dispose()


def _tick(defs, instance, sensor_name: str):
    from orchestration.definitions import build_resources
    from queue_db.config import Settings

    with dg.build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=sensor_name,
        resources=build_resources(Settings.from_env()),
    ) as ctx:
        return defs.get_sensor_def(sensor_name).evaluate_tick(ctx)


def test_roll_ups_evaluate_every_check_and_a_known_failure_is_not_rolled_up_again(processed):
    defs, instance, queue, keys = processed
    check_keys = list(defs.resolve_asset_graph().asset_check_keys)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(check_keys)
    assert {key.name for key in latest} == {key.name for key in check_keys}, "a check was never evaluated"
    assert all(record.status.value == "SUCCEEDED" for record in latest.values()), latest
    passed = {key.name: record.event.dagster_event.asset_check_evaluation_data.passed for key, record in latest.items()}
    assert all(passed.values()), passed

    runs = instance.get_runs()
    rollups = [r for r in runs if r.tags.get(KIND_TAG) == "rollup_ocr" and r.status == dg.DagsterRunStatus.FAILURE]
    assert len(rollups) == 1, "the broken file's roll-up fails once"
    for run in runs:
        assert run.tags[PROCESS_TAG].endswith(f"pid {run.tags['docqueue/runner'].split(':')[1]}")
        assert run.tags[RANGE_TAG].endswith(("document)", "documents)", "page)", "pages)", "chunk)", "chunks)"))

    # a person re-runs the broken file's OCR (as a backfill of its partition does): it fails once, with its reason
    result = defs.resolve_job_def("ocr_document_job").execute_in_process(
        instance=instance, partition_key=keys["bad"], raise_on_error=False
    )
    assert not result.success
    rerun = instance.get_run_by_id(result.run_id)
    assert rerun.tags[KIND_TAG] == "ocr_document" and rerun.tags["docqueue/phase"] == "ocr"
    assert rerun.tags[RANGE_TAG] == f"{keys['bad']} (1 document)"
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description.startswith(f"{keys['bad']}: encrypted")
    observed = [
        e.asset_observation
        for e in instance.all_logs(result.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)
        if e.asset_observation is not None
    ]
    # the partition's reason, and no batch summary that reads like any other observation
    assert [(o.partition, o.metadata["error_class"].value) for o in observed] == [(keys["bad"], "encrypted")]

    # the roll-up sensor has no news: the failure is the one its roll-up recorded
    ticked = _tick(defs, instance, "rollup_ocr_sensor")
    assert not ticked.run_requests
    assert "failed the ocr phase again with the reason their roll-up already shows" in ticked.skip_message
    assert "no run" in ticked.skip_message
    assert not _tick(defs, instance, "rollup_ocr_sensor").run_requests
    assert "again" not in (_tick(defs, instance, "rollup_ocr_sensor").skip_message or "")
