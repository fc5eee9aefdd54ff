"""The Dagster code location loads and holds what the UI and the daemon rely on: the three dynamic partition
definitions, the assets per phase, every sensor and schedule, the asset checks; and partition keys are always
safe for Dagster (no commas, which break UI backfills, and none of the substrings Dagster refuses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.partitions.utils.base import INVALID_PARTITION_SUBSTRINGS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_db.config import Settings
from queue_db.keys import chunk_partition_key, page_partition_key, parse_partition_key
from queue_db.phases import ALL_KINDS
from queue_db.queue import document_key_for


@pytest.fixture(scope="module")
def defs():
    from orchestration.definitions import defs as definitions

    dg.Definitions.validate_loadable(definitions)
    return definitions


@pytest.fixture(scope="module")
def repo(defs):
    return defs.get_repository_def()


def _nodes(repo) -> dict[str, object]:
    return {node.key.to_user_string(): node for node in repo.asset_graph.asset_nodes}


def test_three_dynamic_partition_definitions(repo):
    used = {
        node.partitions_def.name
        for node in _nodes(repo).values()
        if isinstance(node.partitions_def, dg.DynamicPartitionsDefinition)
    }
    assert used == {"documents", "pages", "chunks"}
    assert all(isinstance(node.partitions_def, dg.DynamicPartitionsDefinition) for node in _nodes(repo).values())


@pytest.mark.parametrize(
    "asset,group,partitions,kinds",
    [
        ("ocr_document", "ocr", "documents", {"pymupdf", "postgres"}),
        ("ocr_page", "ocr", "pages", {"pymupdf", "postgres"}),
        ("ocr_document_rollup", "ocr", "documents", {"postgres"}),
        ("vector_page", "vector", "pages", {"python", "postgres"}),
        ("vector_chunk", "vector", "chunks", {"onnx", "qdrant"}),
        ("vector_document_rollup", "vector", "documents", {"postgres"}),
        ("graphrag_chunk", "graphrag", "chunks", {"spacy", "neo4j"}),
        ("graphrag_document_rollup", "graphrag", "documents", {"postgres"}),
    ],
)
def test_assets_per_phase(repo, asset, group, partitions, kinds):
    node = _nodes(repo)[asset]
    assert node.group_name == group
    assert node.partitions_def.name == partitions
    assert set(node.kinds) == kinds
    assert node.tags.get("docqueue/phase") == group
    # ranged runs: a backfill of N keys is one run, not N
    assert node.backfill_policy == dg.BackfillPolicy.single_run()


def test_every_task_kind_has_an_asset_and_a_job(repo):
    nodes = _nodes(repo)
    assert set(nodes) == {k.name for k in ALL_KINDS} | {
        "ocr_document_rollup",
        "vector_document_rollup",
        "graphrag_document_rollup",
    }
    jobs = {job.name for job in repo.get_all_jobs()}
    for kind in ALL_KINDS:
        assert f"{kind.name}_job" in jobs
        assert nodes[kind.name].group_name == kind.phase.value
    assert {
        "rollup_ocr_job",
        "rollup_vector_job",
        "rollup_graphrag_job",
        "recovery_job",
        "nightly_reconciliation_job",
    } <= jobs


def test_phase_dependencies(repo):
    graph = repo.asset_graph
    parents = {node.key.to_user_string(): {p.to_user_string() for p in node.parent_keys} for node in graph.asset_nodes}
    assert parents["ocr_page"] == {"ocr_document"}
    assert parents["vector_page"] == {"ocr_page"}
    assert parents["vector_chunk"] == {"vector_page"}
    assert parents["graphrag_chunk"] == {"vector_chunk"}
    assert parents["graphrag_document_rollup"] == {"graphrag_chunk"}


def test_sensors(repo):
    sensors = {sensor.name: sensor for sensor in repo.sensor_defs}
    expected = {
        "inbox_sensor",
        "s3_intake_sensor",
        *(f"{kind.name}_sensor" for kind in ALL_KINDS),
        "rollup_ocr_sensor",
        "rollup_vector_sensor",
        "rollup_graphrag_sensor",
        "recovery_sensor",
    }
    assert set(sensors) == expected
    for name, sensor in sensors.items():
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING, name
        assert "database" in sensor.required_resource_keys, name
    for kind in ALL_KINDS:
        assert sensors[f"{kind.name}_sensor"].job_name == f"{kind.name}_job"
    # recovery runs only when there is something to recover, checked every TASK_QUEUE_CHECK_INTERVAL=60
    assert sensors["recovery_sensor"].job_name == "recovery_job"
    assert sensors["recovery_sensor"].minimum_interval_seconds == 60


def test_schedules(repo):
    schedules = {schedule.name: schedule for schedule in repo.schedule_defs}
    assert set(schedules) == {"nightly_reconciliation", "asset_checks"}
    assert schedules["asset_checks"].job_name == "asset_checks_job"
    nightly = schedules["nightly_reconciliation"]
    minute, hour, *rest = nightly.cron_schedule.split()
    assert minute.isdigit() and hour.isdigit() and rest == ["*", "*", "*"], "once a day"
    assert nightly.job_name == "nightly_reconciliation_job"
    assert all(s.default_status == dg.DefaultScheduleStatus.RUNNING for s in schedules.values())


def test_schedules_and_sensors_follow_their_settings():
    """Loaded with other values (in a fresh process: the intervals are part of the definitions), the recovery
    sensor checks every TASK_QUEUE_CHECK_INTERVAL and the other sensors tick every DOCQUEUE_SENSOR_INTERVAL."""
    script = (
        "from orchestration.definitions import defs\n"
        "print(defs.get_sensor_def('recovery_sensor').minimum_interval_seconds)\n"
        "print(defs.get_schedule_def('nightly_reconciliation').cron_schedule)\n"
        "print(sorted({s.minimum_interval_seconds for s in defs.sensors if s.name != 'recovery_sensor'}))"
    )
    env = {
        **os.environ,
        "TASK_QUEUE_CHECK_INTERVAL": "420",
        "DOCQUEUE_SENSOR_INTERVAL": "40",
        "DOCQUEUE_NIGHTLY_CRON": "30 1 * * *",
    }
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["420", "30 1 * * *", "[40]"]


def test_asset_checks(repo):
    checks = {(key.asset_key.to_user_string(), key.name) for key in repo.asset_graph.asset_check_keys}
    assert checks == {
        ("ocr_document", "has_pages_or_stated_failure"),
        ("ocr_page", "no_task_stuck_in_processing"),
        ("ocr_document_rollup", "parents_agree_with_children"),
        ("vector_chunk", "vectors_agree_with_queue"),
        ("graphrag_chunk", "graph_agrees_with_queue"),
    }


def test_checks_run_in_their_own_job_not_in_the_task_jobs(defs):
    """A task run plans no check (it would only skip it); the checks job runs every check and no asset."""
    from orchestration.jobs import phase_jobs
    from queue_db.phases import PHASES

    check_nodes = {
        f"{key.asset_key.to_user_string()}_{key.name}" for key in defs.resolve_asset_graph().asset_check_keys
    }
    for job in phase_jobs(PHASES):
        nodes = {node.name for node in defs.resolve_job_def(job.name).graph.node_defs}
        assert nodes and not nodes & check_nodes, (job.name, nodes)
    checks_job = defs.resolve_job_def("asset_checks_job")
    assert {node.name for node in checks_job.graph.node_defs} == check_nodes
    assert not checks_job.asset_layer.selected_asset_keys


def test_resources_keep_secrets_out_of_run_config(monkeypatch):
    """Resources are built from the settings, and every secret goes in as a `dg.EnvVar`: its value is never a
    literal field that code, run config or the UI's resource page could show."""
    from orchestration.code_location import build_resources

    secrets = {
        "DOCQUEUE_DATABASE_URL": "postgresql://u:db-secret@127.0.0.1:1/x",
        "DOCQUEUE_QDRANT_URL": "http://u:qdrant-secret@127.0.0.1:1",
        "DOCQUEUE_QDRANT_API_KEY": "key-secret",
        "DOCQUEUE_NEO4J_URI": "bolt://127.0.0.1:1",
        "DOCQUEUE_NEO4J_PASSWORD": "graph-secret",
        "DOCQUEUE_LLM_API_KEY": "llm-secret",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    resources = build_resources(Settings.from_env())
    for name, resource in resources.items():
        for field, value in resource.model_dump().items():
            if isinstance(value, str) and not isinstance(value, dg.EnvVar):
                assert "secret" not in value, (name, field)
    env_vars = {
        value.env_var_name
        for r in resources.values()
        for value in r.model_dump().values()
        if isinstance(value, dg.EnvVar)
    }
    assert {
        "DOCQUEUE_DATABASE_URL",
        "DOCQUEUE_QDRANT_URL",
        "DOCQUEUE_QDRANT_API_KEY",
        "DOCQUEUE_NEO4J_PASSWORD",
        "DOCQUEUE_LLM_API_KEY",
    } <= env_vars


# ------------------------------------------------------------------------------------------------ partition keys
_HOSTILE = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120) | st.sampled_from(
    [
        "a,b.pdf",
        ",,,.pdf",
        "...",
        "../../etc/passwd",
        "C:\\Users\\x\\report,final.pdf",
        "..pdf",
        "\n\t\0.pdf",
        "über,straße.PDF",
        "名前,テスト.pdf",
        "[a]{b}(c)*?.pdf",
        "-.pdf",
        ".hidden",
        "a" * 500 + ".pdf",
        "",
    ]
)


def _assert_safe(key: str) -> None:
    assert "," not in key
    assert not any(bad in key for bad in INVALID_PARTITION_SUBSTRINGS), key


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    filename=_HOSTILE,
    digest=st.binary(min_size=32, max_size=32),
    page=st.integers(1, 99_999),
    chunk=st.integers(0, 9_999),
)
def test_partition_keys_are_comma_free_and_parse_back(filename, digest, page, chunk):
    content_hash = digest.hex()
    document = document_key_for(filename, content_hash)
    keys = [document, page_partition_key(document, page), chunk_partition_key(document, page, chunk)]
    for key in keys:
        _assert_safe(key)
    assert document.endswith(content_hash[:8])
    assert "/" not in document and len(document) <= 60 + 1 + 8
    assert parse_partition_key(keys[1]).page_number == page
    parsed = parse_partition_key(keys[2])
    assert (parsed.document_key, parsed.page_number, parsed.chunk_index) == (document, page, chunk)


def test_dagster_accepts_hostile_keys_and_ranges_over_them():
    """Dagster's own validation and its range lookup (what a UI backfill does) on keys from hostile names."""
    names = ["a,b.pdf", "...pdf", "x\ny.pdf", "名前.pdf", "../up.pdf"]
    keys = [chunk_partition_key(document_key_for(n, f"{i:08x}".ljust(64, "0")), 1, 0) for i, n in enumerate(names)]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("chunks", keys)
        partitions = dg.DynamicPartitionsDefinition(name="chunks")
        assert partitions.get_partition_keys(dynamic_partitions_store=instance) == keys
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            selected = partitions.get_partition_keys_in_range(dg.PartitionKeyRange(keys[1], keys[3]))
        assert selected == keys[1:4]


def test_dg_check_defs_loads_the_project(docqueue_env):
    """`dg check defs` (what a dg user runs, and the loader behind `docqueue ui`'s `dg dev`) loads the code location
    from pyproject.toml's [tool.dg] in this environment."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    dg_cli = Path(sys.executable).parent / "dg"
    result = subprocess.run(
        [str(dg_cli), "check", "defs", "--use-active-venv", "--target-path", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VIRTUAL_ENV": sys.prefix},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
