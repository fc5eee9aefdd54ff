"""The OCR roll-up places documents in content groups: the roll-up sensor's run over two documents whose OCR
completed, one a near copy of the other, materializes `ocr_document_rollup` with the group in its metadata (what the
Dagster UI shows), and running it again changes nothing. Real PostgreSQL, a real Dagster instance."""

from __future__ import annotations

import dagster as dg
import pytest

from orchestration.code_location import build_definitions, build_resources
from orchestration.partitions import register_partitions
from queue_db.config import Settings
from queue_db.phases import Level
from resources.database import open_queue
from resources.storage import LocalStorage, storage_root
from tests.integration.test_content_groups import ocr_done, one_word_changed, pages_of, rows


@pytest.fixture
def dagster_env(tmp_path, monkeypatch, create_database, migrated_template):
    from orchestration.environment import dagster_instance

    home = tmp_path / "home"
    for name, value in {
        "DOCQUEUE_HOME": str(home),
        "DOCQUEUE_DATABASE_URL": create_database(template=migrated_template),
        "DOCQUEUE_DAGSTER_PG_URL": create_database(prefix="dagster"),
        "DAGSTER_HOME": str(home / "dagster"),
        "DOCQUEUE_QDRANT_URL": "",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    instance = dagster_instance(settings)
    yield settings, instance
    instance.dispose()


def _rollup(defs, instance, settings) -> bool:
    sensor = defs.get_sensor_def("rollup_ocr_sensor")
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), definitions=defs, sensor_name=sensor.name, resources=build_resources(settings)
    ) as context:
        requests = sensor.evaluate_tick(context).run_requests
    return bool(requests) and all(
        defs.resolve_job_def(r.job_name or "rollup_ocr_job")
        .execute_in_process(instance=instance, tags={**r.tags, "dagster/sensor_name": sensor.name})
        .success
        for r in requests
    )


def test_the_ocr_rollup_places_documents_and_shows_the_group(dagster_env):
    settings, instance = dagster_env
    queue = open_queue(settings)
    storage = LocalStorage(storage_root(settings))  # where the roll-up's storage resource reads
    text = pages_of(7)
    first = ocr_done(queue, storage, "leaflet.pdf", text)
    # three words changed per page: a copy whose estimated similarity is below 1
    changed = one_word_changed(one_word_changed(one_word_changed(text, 20), 60), 100)
    copy = ocr_done(queue, storage, "leaflet-copy.pdf", changed)
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    defs = build_definitions(settings)

    assert _rollup(defs, instance, settings)
    records = instance.fetch_materializations(dg.AssetKey("ocr_document_rollup"), limit=10).records
    metadata = {r.partition_key: r.asset_materialization.metadata for r in records}
    assert set(metadata) == {first["document_key"], copy["document_key"]}
    placed = {key: (m["content_group"].value, m["copies"].value) for key, m in metadata.items()}
    # placed in one run: the copy finds the first, and both materializations show the group
    assert placed == {key: (first["document_key"], 1) for key in (first["document_key"], copy["document_key"])}
    assert 0.8 <= metadata[copy["document_key"]]["similarity"].value < 1
    assert rows(queue, "content_group_members") == 2 and rows(queue, "document_signature_bands") == 2 * 24

    # the roll-up again (a person re-runs it from the UI): the same group, no row twice
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE documents SET ocr_rollup_at = NULL")
    assert _rollup(defs, instance, settings)
    assert rows(queue, "content_group_members") == 2 and rows(queue, "document_signature_bands") == 2 * 24
    assert rows(queue, "content_groups") == 1
