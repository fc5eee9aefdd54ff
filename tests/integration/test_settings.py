"""The settings layer at the edges: a bad variable stops the CLI and the code location with one sentence naming it,
TASK_QUEUE_ENABLED=false keeps `docqueue run` off the queue, and WORKER_POLL_INTERVAL paces the runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.queue_support import build_document

DOCQUEUE = str(Path(sys.executable).with_name("docqueue"))
REPO = Path(__file__).resolve().parents[2]
TYPO = "DOCQUEUE_SENSOR_INTERVAL must be a whole number, got 'abc'"


def _environment(**changes: str) -> dict[str, str]:
    return {**os.environ, **changes}


def test_the_cli_names_a_bad_variable_in_one_sentence():
    proc = subprocess.run(
        [DOCQUEUE, "status"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=_environment(DOCQUEUE_SENSOR_INTERVAL="abc"),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"docqueue: {TYPO}"
    assert proc.stdout == ""


def test_the_cli_never_shows_a_secret_while_naming_a_bad_variable():
    proc = subprocess.run(
        [DOCQUEUE, "status"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=_environment(
            MAX_TASK_RETRIES="-1",
            DOCQUEUE_NEO4J_PASSWORD="hunter2-graph",
            DOCQUEUE_DATABASE_URL="postgresql://u:hunter2-db@127.0.0.1:1/q",
            DOCQUEUE_LLM_API_KEY="hunter2-llm",
        ),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "docqueue: MAX_TASK_RETRIES must be at least 0, got -1"
    assert "hunter2" not in proc.stderr + proc.stdout


def test_the_code_location_fails_to_load_with_the_sentence(tmp_path):
    """Loaded by Dagster itself (the loader the webserver and daemon use), with an instance of its own."""
    dagster = str(Path(sys.executable).with_name("dagster"))
    proc = subprocess.run(
        [dagster, "definitions", "validate", "-m", "orchestration.definitions"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=_environment(DOCQUEUE_SENSOR_INTERVAL="abc", DAGSTER_HOME=str(tmp_path)),
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # Dagster's log colours
    assert proc.returncode != 0
    assert re.search(
        r"Validation failed for code location orchestration\.definitions:\s+"
        rf"queue_db\.settings_group\.SettingsError: {re.escape(TYPO)}\n",
        output,
    ), output
    # stopped by the validation at the top of the code location, before any module read the variable itself
    assert "orchestration/definitions.py" in output and "orchestration/sensors.py" not in output
    assert "pydantic" not in output


@pytest.fixture
def runner_env(docqueue_env):
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    yield defs, instance, open_queue(Settings.from_env())
    instance.dispose()


def _chunk_statuses(queue) -> list[str]:
    return sorted(row["vector_status"] for row in queue.chunks())


def test_a_disabled_queue_is_left_alone_by_the_runner_and_docqueue_run(runner_env, monkeypatch):
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings

    defs, instance, queue = runner_env
    build_document(queue, pages=1, chunks_per_page=2)
    before = _chunk_statuses(queue)
    monkeypatch.setenv("TASK_QUEUE_ENABLED", "false")
    report = run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, max_seconds=60)
    assert report.runs == 0 and not instance.get_runs()
    proc = subprocess.run([DOCQUEUE, "run", "--until-idle"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "docqueue: TASK_QUEUE_ENABLED is false: the queue is left alone (nothing was run)"
    assert _chunk_statuses(queue) == before == ["pending", "pending"] and not instance.get_runs()


def test_the_runner_polls_every_worker_poll_interval(runner_env, monkeypatch):
    """With nothing to do and not `--until-idle`, each planning round is followed by a WORKER_POLL_INTERVAL wait."""
    import orchestration.runner as runner
    from queue_db.config import Settings

    defs, instance, queue = runner_env
    rounds = []
    plan_next = runner.plan_next
    monkeypatch.setattr(runner, "plan_next", lambda *args, **kwargs: rounds.append(1) or plan_next(*args, **kwargs))

    def planning_rounds(poll: str, seconds: float) -> int:
        from queue_db.config import QueueSettings

        rounds.clear()
        monkeypatch.setenv("WORKER_POLL_INTERVAL", poll)
        queue.settings = QueueSettings.from_config(Settings.from_env().queue)
        runner.run_until_idle(
            defs, instance, queue, settings=Settings.from_env(), until_idle=False, max_seconds=seconds
        )
        return len(rounds)

    assert planning_rounds("3", seconds=1.0) == 1  # one round, then a 3 s wait outlasts the budget
    assert planning_rounds("0.2", seconds=1.5) >= 3
