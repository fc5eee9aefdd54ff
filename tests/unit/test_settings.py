"""The typed settings layer (queue_db.config): defaults, one-sentence errors naming the variable, secrets kept out
of reprs and errors, changes to the environment taking effect, and the recovery schedule's cron."""

from __future__ import annotations

import os

import pytest

from queue_db import config
from queue_db.config import (
    ALL_GROUPS,
    DatabaseConfig,
    QueueSettings,
    Settings,
    SettingsError,
    StorageConfig,
    settings,
    validate_settings,
)
from queue_db.service_config import DagsterConfig, ExtractionConfig, GraphConfig, VectorStoreConfig

EVERY_VARIABLE = [name for group in ALL_GROUPS for name in group.variables()]

# the values every variable had before the settings layer: a default moving is a behaviour change, not a refactor
PREVIOUS_DEFAULTS = {
    "WORKER_POLL_INTERVAL": 5.0,
    "HEARTBEAT_INTERVAL": 30.0,
    "STALE_TASK_TIMEOUT": 120.0,
    "MAX_TASK_RETRIES": 3,
    "DOCQUEUE_RETRY_BACKOFF_BASE": 10.0,
    "DOCQUEUE_RETRY_BACKOFF_MAX": 600.0,
    "DOCQUEUE_DB_OUTAGE_MAX_S": 300.0,
    "DOCQUEUE_STATS_WINDOW": 10000,
    "DOCQUEUE_HOME": ".docqueue",
    "DOCQUEUE_EXECUTOR": "",
    "DOCQUEUE_BROKER_URL": None,
    "DOCQUEUE_CELERY_BACKEND": None,
    "DOCQUEUE_CELERY_VISIBILITY_TIMEOUT": 3600.0,
    "DOCQUEUE_CELERY_POLL_INTERVAL": 0.1,
    "DOCQUEUE_PHASE_RUN_LIMITS": "",
    "DOCQUEUE_DAGSTER_YAML": "",
    "DOCQUEUE_DEBUG": False,
    "DOCQUEUE_DATABASE_URL": None,
    "DOCQUEUE_DAGSTER_PG_URL": None,
    "DOCQUEUE_PG_PORT": 0,
    "DAGSTER_HOME": "",
    "DOCQUEUE_DAGSTER_PG_POOL_SIZE": 2,
    "DOCQUEUE_DAGSTER_PG_MAX_OVERFLOW": 3,
    "DOCQUEUE_DAGSTER_PG_POOL_RECYCLE_S": 1800,
    "DOCQUEUE_DAGSTER_PG_POOL_TIMEOUT_S": 30,
    "DOCQUEUE_STORAGE_DIR": "",
    "DOCQUEUE_MAX_FILE_MB": 200.0,
    "DOCQUEUE_MAX_PAGES": 2000,
    "DOCQUEUE_MAX_RENDER_PIXELS": 25_000_000,
    "DOCQUEUE_PAGE_TIMEOUT": 120.0,
    "DOCQUEUE_WORKER_MEMORY_MB": 3072,
    "DOCQUEUE_OCR_DPI": 200,
    "DOCQUEUE_MIN_TEXT_CHARS": 20,
    "DOCQUEUE_MAX_UNMAPPED_SHARE": 0.3,
    "DOCQUEUE_MAX_LOOKALIKE_SHARE": 0.2,
    "DOCQUEUE_OCR_THREADS": min(2, os.cpu_count() or 1),
    "DOCQUEUE_OCR_LANGUAGES": "",
    "DOCQUEUE_WORKER_START_TIMEOUT": 60.0,
    "DOCQUEUE_PDF_FALLBACK": "pdfium",
    "DOCQUEUE_MAX_TEXT_MB": 20.0,
    "DOCQUEUE_TEXT_PAGE_CHARS": 20_000,
    "DOCQUEUE_MAX_CHUNKS_PER_PAGE": 200,
    "DOCQUEUE_SHEET_PAGE_ROWS": 50,
    "DOCQUEUE_MAX_SHEET_ROWS": 100_000,
    "DOCQUEUE_MAX_SHEETS": 100,
    "DOCQUEUE_MAX_UNZIPPED_MB": 200.0,
    "DOCQUEUE_OFFICE_TIMEOUT": 120.0,
    "DOCQUEUE_EMBEDDING_MODEL": "all-MiniLM-L6-v2-int8",
    "DOCQUEUE_EMBED_BATCH": 32,
    "DOCQUEUE_EMBED_THREADS": 0,
    "DOCQUEUE_EMBED_MAX_WINDOWS": 8,
    "DOCQUEUE_EMBED_BATCH_TOKENS": 1024,
    "DOCQUEUE_EMBED_TIMEOUT": 300.0,
    "DOCQUEUE_EMBEDDING_DEDUP": True,
    "DOCQUEUE_QDRANT_URL": None,
    "DOCQUEUE_QDRANT_API_KEY": None,
    "DOCQUEUE_QDRANT_PATH": "",
    "DOCQUEUE_QDRANT_LOCK_TIMEOUT": 120.0,
    "DOCQUEUE_QDRANT_BATCH": 256,
    "DOCQUEUE_QDRANT_TIMEOUT": 30.0,
    "DOCQUEUE_QDRANT_LINGER": 2.0,
    "DOCQUEUE_QDRANT_MIGRATE_BATCH": 1000,
    "DOCQUEUE_QDRANT_HYBRID_CANDIDATES": 50,
    "DOCQUEUE_QDRANT_HNSW_EF": 128,
    "DOCQUEUE_QDRANT_SEGMENT_POINTS": 200_000,
    "DOCQUEUE_QDRANT_INDEX_TAIL": 50_000,
    "DOCQUEUE_NEO4J_URI": "",
    "DOCQUEUE_NEO4J_USER": "neo4j",
    "DOCQUEUE_NEO4J_PASSWORD": None,
    "DOCQUEUE_NEO4J_DATABASE": "",
    "DOCQUEUE_GRAPH_BATCH_SIZE": 100,
    "DOCQUEUE_GRAPH_CONFLICT_RETRIES": 5,
    "DOCQUEUE_GRAPH_TX_TIMEOUT_S": 30.0,
    "DOCQUEUE_BOLT_PORT": 0,
    "DOCQUEUE_BOLT_HEAP_MB": 512,
    "DOCQUEUE_BOLT_JAVA_OPTS": "",
    "DOCQUEUE_CLI_GRAPH_RETRY_S": 5.0,
    "DOCQUEUE_SEARCH_ENTITIES_PER_HIT": 10,
    "DOCQUEUE_SEARCH_RELATED_PER_HIT": 5,
    "DOCQUEUE_EXTRACTOR": "spacy",
    "DOCQUEUE_EXTRACT_MAX_CHARS": 20_000,
    "DOCQUEUE_EXTRACT_BATCH_SIZE": 16,
    "DOCQUEUE_EXTRACT_MAX_ENTITIES": 100,
    "DOCQUEUE_EXTRACT_MAX_RELATIONS": 300,
    "DOCQUEUE_EXTRACT_MAX_SENTENCE_ENTITIES": 12,
    "DOCQUEUE_EXTRACT_TIMEOUT": 600.0,
    "DOCQUEUE_LLM_BASE_URL": "",
    "DOCQUEUE_LLM_MODEL": "",
    "DOCQUEUE_LLM_API_KEY": None,
    "DOCQUEUE_LLM_TIMEOUT_S": 60.0,
    "DOCQUEUE_LLM_MAX_TOKENS": 2048,
    "DOCQUEUE_LLM_MAX_RETRIES": 2,
    "DOCQUEUE_LLM_CONCURRENCY": 2,
    "DOCQUEUE_SENSOR_INTERVAL": 15,
    "DOCQUEUE_SENSOR_MAX_RUNS": 10,
    "DOCQUEUE_NIGHTLY_CRON": "0 3 * * *",
    "DOCQUEUE_CHECKS_CRON": "30 3 * * *",
    "DOCQUEUE_RUN_MAX_KEYS_OCR_DOCUMENT": 50,
    "DOCQUEUE_RUN_MAX_KEYS_OCR_PAGE": 100,
    "DOCQUEUE_RUN_MAX_KEYS_VECTOR_PAGE": 200,
    "DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK": 1000,
    "DOCQUEUE_RUN_MAX_KEYS_GRAPHRAG_CHUNK": 1000,
    "DOCQUEUE_RUN_OVERHEAD_SHARE": 0.05,
    "DOCQUEUE_ROLLUP_HOLD_S": 15.0,
    "DOCQUEUE_PARTITION_RETENTION": 7 * 86400.0,
    "DOCQUEUE_PARTITION_MAX_COMPLETED": 10_000,
    "DOCQUEUE_PARTITION_RETIRE_BATCH": 5000,
    "DOCQUEUE_PARTITION_KEY_CACHE_MAX": 500_000,
    "DOCQUEUE_VERIFY_PAGE": 1000,
    "DOCQUEUE_INBOX": "",
    "DOCQUEUE_INBOX_MAX_FILES": 500,
    "DOCQUEUE_S3_URL": "",
    "DOCQUEUE_S3_BUCKET": "",
    "DOCQUEUE_S3_PREFIX": "",
    "DOCQUEUE_S3_MAX_OBJECTS": 50,
    "DOCQUEUE_S3_MAX_LIST": 100_000,
    "DOCQUEUE_S3_LOOKBACK": 900.0,
    "DOCQUEUE_S3_TIMEOUT": 60.0,
    "AWS_REGION": "",
    "DOCQUEUE_DEFAULT_TENANT": "default",
    "DOCQUEUE_DELETE_BATCH": 100,
    # the seed's settings that had no variable before
    "TASK_QUEUE_ENABLED": True,
    "TASK_QUEUE_CHECK_INTERVAL": 60.0,
    "DOCQUEUE_NEAR_DUP": True,
    "DOCQUEUE_NEAR_DUP_THRESHOLD": 0.7,
    "DOCQUEUE_NEAR_DUP_MAX_PAGES": 200,
    "DOCQUEUE_NEAR_DUP_MAX_CHARS": 2_000_000,
    "DOCQUEUE_NEAR_DUP_MAX_SHINGLES": 100_000,
    "DOCQUEUE_NEAR_DUP_MAX_CANDIDATES": 100,
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in EVERY_VARIABLE:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_variable_is_named_once():
    assert len(EVERY_VARIABLE) == len(set(EVERY_VARIABLE))


def test_defaults_are_unchanged(clean_env):
    actual = {
        info.alias: getattr(settings(group), attribute)
        for group in ALL_GROUPS
        for attribute, info in group.model_fields.items()
    }
    assert actual == PREVIOUS_DEFAULTS
    # the dataclass's own defaults agree with the variables
    assert QueueSettings() == QueueSettings.from_config(Settings.from_env().queue)


def test_empty_counts_as_unset_and_values_are_stripped(clean_env):
    clean_env.setenv("DOCQUEUE_SENSOR_INTERVAL", "")
    clean_env.setenv("DOCQUEUE_NEO4J_URI", "  bolt://graph:7687 ")
    assert settings(DagsterConfig).sensor_interval_s == 15
    assert settings(GraphConfig).uri == "bolt://graph:7687"


@pytest.mark.parametrize(
    "name,value,sentence",
    [
        ("DOCQUEUE_SENSOR_INTERVAL", "abc", "DOCQUEUE_SENSOR_INTERVAL must be a whole number, got 'abc'"),
        ("WORKER_POLL_INTERVAL", "5s", "WORKER_POLL_INTERVAL must be a number, got '5s'"),
        ("TASK_QUEUE_ENABLED", "maybe", "TASK_QUEUE_ENABLED must be true or false, got 'maybe'"),
        ("MAX_TASK_RETRIES", "-1", "MAX_TASK_RETRIES must be at least 0, got -1"),
        ("DOCQUEUE_MAX_FILE_MB", "0", "DOCQUEUE_MAX_FILE_MB must be greater than 0, got 0"),
        ("DOCQUEUE_PG_PORT", "70000", "DOCQUEUE_PG_PORT must be at most 65535, got 70000"),
        ("DOCQUEUE_EXTRACTOR", "gpt", "DOCQUEUE_EXTRACTOR names an unknown extractor 'gpt' (use spacy or llm)"),
        (
            "DOCQUEUE_PDF_FALLBACK",
            "qpdf",
            "DOCQUEUE_PDF_FALLBACK names an unknown PDF engine 'qpdf' (use pdfium or off)",
        ),
        (
            "DOCQUEUE_OCR_LANGUAGES",
            "eng, rus",
            "DOCQUEUE_OCR_LANGUAGES must be Tesseract language names joined by + (such as eng+rus), got 'eng, rus'",
        ),
        ("DOCQUEUE_NIGHTLY_CRON", "3am", "DOCQUEUE_NIGHTLY_CRON must be a cron expression of five fields, got '3am'"),
    ],
)
def test_a_bad_value_is_one_sentence_naming_its_variable(clean_env, name, value, sentence):
    clean_env.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        validate_settings()
    assert str(raised.value) == sentence
    assert raised.value.__cause__ is None and raised.value.__context__ is None  # no pydantic report attached


def test_several_bad_values_name_the_first_and_count_the_rest(clean_env):
    clean_env.setenv("DOCQUEUE_SENSOR_INTERVAL", "abc")
    clean_env.setenv("HEARTBEAT_INTERVAL", "soon")
    clean_env.setenv("DOCQUEUE_OCR_DPI", "0")
    with pytest.raises(
        SettingsError,
        match=r"^HEARTBEAT_INTERVAL must be a number, got 'soon' "
        r"\(and 2 more invalid settings\)$",
    ):
        validate_settings()


def test_secrets_stay_out_of_reprs_and_errors(clean_env):
    secrets = {
        "DOCQUEUE_DATABASE_URL": "postgresql://u:pw-database@db/q",
        "DOCQUEUE_DAGSTER_PG_URL": "postgresql://u:pw-dagster@db/d",
        "DOCQUEUE_QDRANT_URL": "https://u:pw-qdrant-url@qdrant:6333",
        "DOCQUEUE_QDRANT_API_KEY": "pw-qdrant-key",
        "DOCQUEUE_NEO4J_PASSWORD": "pw-neo4j",
        "DOCQUEUE_LLM_API_KEY": "pw-llm",
    }
    for name, value in secrets.items():
        clean_env.setenv(name, value)
    shown = " ".join(f"{settings(group)!r} {settings(group)}" for group in ALL_GROUPS)
    assert "pw-" not in shown
    assert settings(DatabaseConfig).database_url.get_secret_value() == secrets["DOCQUEUE_DATABASE_URL"]
    assert config.secret_value(settings(ExtractionConfig).llm_api_key) == "pw-llm"
    assert config.secret_value(None) == ""
    clean_env.setenv("MAX_TASK_RETRIES", "many")
    with pytest.raises(SettingsError) as raised:
        validate_settings()
    assert "pw-" not in str(raised.value)


def test_a_changed_variable_takes_effect_at_the_next_read(clean_env):
    first = settings(StorageConfig)
    assert settings(StorageConfig) is first  # unchanged environment: the same object, no re-validation
    clean_env.setenv("DOCQUEUE_MAX_PAGES", "40")
    assert settings(StorageConfig).max_pages == 40
    clean_env.setenv("DOCQUEUE_MAX_PAGES", "lots")
    with pytest.raises(SettingsError, match="DOCQUEUE_MAX_PAGES"):
        settings(StorageConfig)
    assert settings(VectorStoreConfig).upsert_batch == 256  # other groups keep working
    clean_env.delenv("DOCQUEUE_MAX_PAGES")
    assert settings(StorageConfig).max_pages == 2000
