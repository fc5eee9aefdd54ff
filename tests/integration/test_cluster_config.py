"""Cluster configuration without a cluster: the executor chosen by the environment, the worker's refusals, the
per-phase run limits sized by DOCQUEUE_PHASE_RUN_LIMITS, and the Kubernetes instance config
(deploy/k8s/dagster.yaml) checked against Dagster's instance schema and dagster-k8s's K8sRunLauncher schema."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_INSTANCE = REPO_ROOT / "deploy" / "k8s" / "dagster.yaml"
DOCQUEUE = Path(sys.executable).with_name("docqueue")


def test_the_kubernetes_instance_config_passes_dagster_and_dagster_k8s_schemas(tmp_path, monkeypatch):
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_k8s import K8sRunLauncher

    monkeypatch.setenv("DOCQUEUE_DAGSTER_PG_URL", "postgresql://docqueue@db.internal/dagster")
    monkeypatch.setenv("DOCQUEUE_DAGSTER_YAML", str(K8S_INSTANCE))
    monkeypatch.delenv("DOCQUEUE_PHASE_RUN_LIMITS", raising=False)
    from orchestration.environment import instance_yaml
    from queue_db.config import Settings

    (tmp_path / "dagster.yaml").write_text(instance_yaml(Settings.from_env().cluster))
    config, _ = dagster_instance_config(str(tmp_path))  # raises on anything Dagster's schema refuses
    launcher = config["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    checked = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert checked.success, [error.message for error in checked.errors]
    assert checked.value["env_secrets"] == ["docqueue-services"]
    # the same check refuses a misspelt field, so a broken file cannot pass
    broken = process_config(K8sRunLauncher.config_type(), {**launcher["config"], "job_imag": "x"})
    assert not broken.success
    assert config["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}


def test_phase_run_limits_scale_the_instance_config(monkeypatch):
    from orchestration.environment import instance_yaml
    from queue_db.config import Settings

    monkeypatch.delenv("DOCQUEUE_DAGSTER_YAML", raising=False)
    monkeypatch.setenv("DOCQUEUE_PHASE_RUN_LIMITS", "ocr=6, vector=4,graphrag=2")
    config = yaml.safe_load(instance_yaml(Settings.from_env().cluster))
    runs = config["concurrency"]["runs"]
    assert runs["max_concurrent_runs"] >= 6 + 4 + 2
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    monkeypatch.setenv("DOCQUEUE_PHASE_RUN_LIMITS", "ocr=lots")
    with pytest.raises(ValueError, match="DOCQUEUE_PHASE_RUN_LIMITS takes phase=limit pairs"):
        instance_yaml(Settings.from_env().cluster)


def test_the_executor_follows_the_environment(monkeypatch):
    from orchestration.cluster import ClusterConfigError, celery_settings, executor_for
    from queue_db.config import Settings

    def executor_from_env():
        return executor_for(Settings.from_env().cluster)

    monkeypatch.delenv("DOCQUEUE_EXECUTOR", raising=False)
    assert executor_from_env().name == "in_process"  # a launched run's step in the run's own process
    monkeypatch.setenv("DOCQUEUE_EXECUTOR", "celery")
    monkeypatch.delenv("DOCQUEUE_BROKER_URL", raising=False)
    with pytest.raises(ClusterConfigError, match="needs DOCQUEUE_BROKER_URL"):
        executor_from_env()
    monkeypatch.setenv("DOCQUEUE_BROKER_URL", "redis://:secret@broker.internal:6379/0")
    executor = executor_from_env()
    assert executor.name == "docqueue_celery"
    # a step is acknowledged only when it finished, so a dead worker's step goes to another worker
    cluster = Settings.from_env().cluster
    assert celery_settings(cluster)["task_acks_late"] and celery_settings(cluster)["task_reject_on_worker_lost"]
    monkeypatch.setenv("DOCQUEUE_EXECUTOR", "kubernetes")
    with pytest.raises(ClusterConfigError, match="must be `celery` or unset"):
        executor_from_env()


def test_a_run_checks_its_steps_result_as_often_as_configured(monkeypatch):
    from dagster_celery import core_execution_loop

    from orchestration.cluster import executor_for
    from queue_db.config import Settings, SettingsError

    def executor_from_env():
        return executor_for(Settings.from_env().cluster)

    monkeypatch.setattr(core_execution_loop, "TICK_SECONDS", core_execution_loop.TICK_SECONDS)  # restored after
    monkeypatch.setenv("DOCQUEUE_EXECUTOR", "celery")
    monkeypatch.setenv("DOCQUEUE_BROKER_URL", "redis://broker.internal:6379/0")
    monkeypatch.delenv("DOCQUEUE_CELERY_POLL_INTERVAL", raising=False)
    executor_from_env()
    assert core_execution_loop.TICK_SECONDS == 0.1
    monkeypatch.setenv("DOCQUEUE_CELERY_POLL_INTERVAL", "0.25")
    executor_from_env()
    assert core_execution_loop.TICK_SECONDS == 0.25
    monkeypatch.setenv("DOCQUEUE_CELERY_POLL_INTERVAL", "0")
    with pytest.raises(SettingsError, match="DOCQUEUE_CELERY_POLL_INTERVAL"):
        executor_from_env()


def test_a_run_sends_its_step_with_what_its_template_loaded(tmp_path):
    """orchestration.cluster.load_executor_code, run in the process runs are forked from, leaves a run's first send of
    its step nothing to import and no scan of the installed packages' entry points (Celery's search for the result
    backend's class, kept per process). In a fresh interpreter, sending to a Redis of its own."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    redis = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe = f"""
import os, sys, time
broker = "redis://127.0.0.1:{port}/0"
os.environ.update(DOCQUEUE_EXECUTOR="celery", DOCQUEUE_BROKER_URL=broker)
from celery.utils.imports import load_extension_class_names
from dagster_celery.make_app import make_app
from orchestration.cluster import load_executor_code
from queue_db.config import Settings
load_executor_code(Settings.from_env().cluster)
loaded, scans = set(sys.modules), load_extension_class_names.cache_info().misses
app = make_app({{"broker": broker, "backend": broker}})  # as dagster-celery's executor builds it in each run
for attempt in range(100):
    try:
        app.send_task("docqueue.probe", args=(), queue="dagster", routing_key="dagster.probe")
        break
    except Exception:
        time.sleep(0.1)
print(scans, load_extension_class_names.cache_info().misses, sorted(set(sys.modules) - loaded))
"""
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    finally:
        redis.terminate()
        redis.wait(timeout=10)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().split(maxsplit=2) == ["1", "1", "[]"], done.stdout


def test_a_worker_without_the_cluster_services_refuses_in_one_sentence(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DOCQUEUE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [str(DOCQUEUE), "worker", "--broker", "redis://127.0.0.1:1/0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DOCQUEUE_DATABASE_URL" in done.stderr and "DOCQUEUE_STORAGE_DIR" in done.stderr
    env.update(
        {
            "DOCQUEUE_DATABASE_URL": "postgresql://x@127.0.0.1:1/q",
            "DOCQUEUE_DAGSTER_PG_URL": "postgresql://x@127.0.0.1:1/d",
            "DOCQUEUE_NEO4J_URI": "bolt://127.0.0.1:1",
            "DOCQUEUE_STORAGE_DIR": str(tmp_path),
            "DOCQUEUE_QDRANT_PATH": str(tmp_path / "qdrant"),
        }
    )
    done = subprocess.run(
        [str(DOCQUEUE), "worker", "--broker", "redis://127.0.0.1:1/0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "cannot reach the broker at redis://127.0.0.1:1/0" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
