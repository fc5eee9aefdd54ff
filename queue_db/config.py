"""Settings shared by every layer: each environment variable docqueue reads, typed, with its default and meaning.

The variables are grouped by concern (one class each). `settings(Group)` builds a group from the current
environment and keeps it until one of the group's variables changes, so a read costs a few dictionary look-ups,
a test's monkeypatch takes effect at once, and resources can read secrets at run time instead of through run
config. `validate_settings()` builds every group: the CLI and the Dagster code location call it when they start,
so a bad value stops them with one sentence naming the variable (`SettingsError`), never a traceback from
whichever module reads it first.

Queue defaults follow the seed's Configuration block (hierarchical-task-queue-v2.md): enabled, recovery every
60 s, poll 5 s, heartbeat 30 s, stale after 120 s, 3 retries.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar

from pydantic import SecretStr, ValidationError, field_validator

from queue_db.settings_group import SettingsError, SettingsGroup, _sentence, default, parse_duration, secret_value  # noqa: F401 - re-exported: every layer imports them from here
from queue_db.settings_group import declare as _var
from queue_db.tenants import TENANT_RULE, tenant_problem


class QueueConfig(SettingsGroup):
    title: ClassVar[str] = "Queue (the seed's settings)"
    disabled_reason: ClassVar[str] = "TASK_QUEUE_ENABLED is false: the queue is left alone"

    enabled: bool = _var(
        True, "TASK_QUEUE_ENABLED", "`false`: sensors, schedules and `docqueue run` leave the queue alone (see below)"
    )
    check_interval_s: float = _var(
        60.0,
        "TASK_QUEUE_CHECK_INTERVAL",
        "seconds between the recovery sensor's checks for stale heartbeats (see below)",
        gt=0,
    )
    poll_interval_s: float = _var(
        5.0,
        "WORKER_POLL_INTERVAL",
        "seconds `docqueue run` waits before looking for work again when none is ready",
        gt=0,
    )
    heartbeat_interval_s: float = _var(30.0, "HEARTBEAT_INTERVAL", "seconds between a worker's heartbeats", gt=0)
    stale_timeout_s: float = _var(
        120.0, "STALE_TASK_TIMEOUT", "seconds without a heartbeat before a running task is released", gt=0
    )
    max_retries: int = _var(3, "MAX_TASK_RETRIES", "retries before a task fails permanently", ge=0)
    retry_backoff_base_s: float = _var(
        10.0, "DOCQUEUE_RETRY_BACKOFF_BASE", "back-off before a failed task is retried: base·2^(attempt−1) s …", ge=0
    )
    retry_backoff_max_s: float = _var(600.0, "DOCQUEUE_RETRY_BACKOFF_MAX", "… capped at this many seconds", ge=0)
    db_outage_max_s: float = _var(
        300.0,
        "DOCQUEUE_DB_OUTAGE_MAX_S",
        "seconds `docqueue run` waits out an unreachable database before giving up",
        ge=0,
    )
    stats_window: int = _var(
        10_000,
        "DOCQUEUE_STATS_WINDOW",
        "completed tasks per type `docqueue stats` takes its timings from (a random sample of "
        "table blocks once a table holds more rows)",
        ge=100,
    )


class DatabaseConfig(SettingsGroup):
    title: ClassVar[str] = "Home and databases"

    home: str = _var(".docqueue", "DOCQUEUE_HOME", "everything the embedded setup stores", shown="`./.docqueue`")
    debug: bool = _var(False, "DOCQUEUE_DEBUG", "`1`: an unexpected CLI error shows its traceback too", shown="unset")
    database_url: Optional[SecretStr] = _var(
        None, "DOCQUEUE_DATABASE_URL", "PostgreSQL of the queue (`postgresql://user:pass@host/db`)", shown="embedded"
    )
    dagster_pg_url: Optional[SecretStr] = _var(
        None,
        "DOCQUEUE_DAGSTER_PG_URL",
        "Dagster's own storage, created by `docqueue db upgrade` when the role may create databases (the embedded "
        "one runs with `synchronous_commit = off`: ~4× cheaper events, queue durability untouched; consider the same "
        "`ALTER DATABASE` on a server)",
        shown="a database beside the queue's: `dagster` beside `docqueue`, `<queue database>_dagster` beside any other",
    )
    # Dagster's own name: its instance folder, read here so that nothing below the entry points reads it
    dagster_home: str = _var(
        "",
        "DAGSTER_HOME",
        "Dagster's instance folder; docqueue writes its dagster.yaml there",
        shown="`<DOCQUEUE_HOME>/dagster`",
    )
    pg_port: int = _var(
        0,
        "DOCQUEUE_PG_PORT",
        "port of the embedded PostgreSQL (127.0.0.1 only); unset: a free port "
        "chosen on the first start and recorded in the home",
        shown="a free port, per home",
        ge=0,
        le=65535,
    )
    dagster_pool_size: int = _var(
        2, "DOCQUEUE_DAGSTER_PG_POOL_SIZE", "connections kept per Dagster storage (run, event log, schedule)", ge=1
    )
    dagster_max_overflow: int = _var(
        3, "DOCQUEUE_DAGSTER_PG_MAX_OVERFLOW", "extra connections a Dagster storage may open under load", ge=0
    )
    dagster_pool_recycle_s: int = _var(
        1800, "DOCQUEUE_DAGSTER_PG_POOL_RECYCLE_S", "seconds before a pooled Dagster connection is replaced", ge=1
    )
    dagster_pool_timeout_s: int = _var(
        30, "DOCQUEUE_DAGSTER_PG_POOL_TIMEOUT_S", "seconds a Dagster storage call waits for a free connection", ge=1
    )

    def home_path(self) -> Path:
        return resolve_home(self.home)


def resolve_home(home: str) -> Path:
    """Root of everything the embedded setup keeps on disk (DOCQUEUE_HOME), resolved and created."""
    path = Path(home).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


class StorageConfig(SettingsGroup):
    title: ClassVar[str] = "Storage and limits"

    storage_dir: str = _var(
        "",
        "DOCQUEUE_STORAGE_DIR",
        "where page markdown and other artefacts are kept",
        shown="`<DOCQUEUE_HOME>/storage`",
    )
    max_file_mb: float = _var(200.0, "DOCQUEUE_MAX_FILE_MB", "largest file accepted (MB)", gt=0)
    max_pages: int = _var(2000, "DOCQUEUE_MAX_PAGES", "most pages per document", gt=0)
    max_render_pixels: int = _var(
        25_000_000,
        "DOCQUEUE_MAX_RENDER_PIXELS",
        "pixels per page raster for OCR; larger pages are rendered at a lower DPI",
        gt=0,
    )
    page_timeout_s: float = _var(
        120.0, "DOCQUEUE_PAGE_TIMEOUT", "seconds per page; past it the conversion process is killed", gt=0
    )
    worker_memory_mb: int = _var(
        3072, "DOCQUEUE_WORKER_MEMORY_MB", "address-space cap of the conversion process (MB)", gt=0
    )
    ocr_dpi: int = _var(200, "DOCQUEUE_OCR_DPI", "resolution pages are rendered at for OCR", gt=0)
    min_text_chars: int = _var(20, "DOCQUEUE_MIN_TEXT_CHARS", "a page with less embedded text is OCR'd", gt=0)
    ocr_threads: int = _var(
        min(2, os.cpu_count() or 1),
        "DOCQUEUE_OCR_THREADS",
        "threads of the OCR engine",
        shown="2 (1 on one core)",
        gt=0,
    )
    worker_start_timeout_s: float = _var(
        60.0, "DOCQUEUE_WORKER_START_TIMEOUT", "seconds the conversion process may take to start", gt=0
    )
    max_text_mb: float = _var(
        20.0, "DOCQUEUE_MAX_TEXT_MB", "largest text, Markdown, HTML or CSV file accepted (MB)", gt=0
    )
    text_page_chars: int = _var(
        20_000, "DOCQUEUE_TEXT_PAGE_CHARS", "characters per page when a text file is split into pages", ge=200
    )
    max_chunks_per_page: int = _var(
        200, "DOCQUEUE_MAX_CHUNKS_PER_PAGE", "a page needing more chunks fails as a validation error", ge=1
    )
    sheet_page_rows: int = _var(
        50, "DOCQUEUE_SHEET_PAGE_ROWS", "spreadsheet and CSV rows per page (the header row is repeated on each)", gt=0
    )
    max_sheet_rows: int = _var(100_000, "DOCQUEUE_MAX_SHEET_ROWS", "most non-empty rows per sheet or CSV", gt=0)
    max_sheets: int = _var(100, "DOCQUEUE_MAX_SHEETS", "most worksheets per workbook", gt=0)
    max_unzipped_mb: float = _var(
        200.0, "DOCQUEUE_MAX_UNZIPPED_MB", "largest uncompressed size of a DOCX or XLSX, checked at intake (MB)", gt=0
    )
    office_timeout_s: float = _var(
        120.0, "DOCQUEUE_OFFICE_TIMEOUT", "seconds to read one Word, Excel or CSV document into pages", gt=0
    )


class EmbeddingConfig(SettingsGroup):
    title: ClassVar[str] = "Embeddings"

    model: str = _var(
        "all-MiniLM-L6-v2-int8", "DOCQUEUE_EMBEDDING_MODEL", "the embedding model (one Qdrant collection per model)"
    )
    batch_size: int = _var(32, "DOCQUEUE_EMBED_BATCH", "texts per embedding batch", ge=1)
    threads: int = _var(0, "DOCQUEUE_EMBED_THREADS", "inference threads; 0 lets the runtime choose", ge=0)
    max_windows: int = _var(8, "DOCQUEUE_EMBED_MAX_WINDOWS", "windows a long text is embedded in, at most", ge=1)
    batch_tokens: int = _var(1024, "DOCQUEUE_EMBED_BATCH_TOKENS", "tokens per embedding batch, at most", ge=1)
    timeout_s: float = _var(
        300.0, "DOCQUEUE_EMBED_TIMEOUT", "seconds per embedding batch before it fails as `timeout`", gt=0
    )
    dedup: bool = _var(
        True,
        "DOCQUEUE_EMBEDDING_DEDUP",
        "a chunk whose text was already embedded by the same model copies that vector instead of being embedded again",
    )


class VectorStoreConfig(SettingsGroup):
    title: ClassVar[str] = "Vector store (Qdrant)"

    # a URL may carry credentials (https://user:pass@host): kept secret like the key
    url: Optional[SecretStr] = _var(
        None,
        "DOCQUEUE_QDRANT_URL",
        "a Qdrant server; unset = the embedded Qdrant Edge store in `DOCQUEUE_QDRANT_PATH` "
        "(see *The embedded vector store*)",
        shown="embedded",
    )
    api_key: Optional[SecretStr] = _var(None, "DOCQUEUE_QDRANT_API_KEY", "API key of the Qdrant server", shown="unset")
    path: str = _var("", "DOCQUEUE_QDRANT_PATH", "folder of the embedded storage", shown="`<DOCQUEUE_HOME>/qdrant`")
    lock_timeout_s: float = _var(
        120.0, "DOCQUEUE_QDRANT_LOCK_TIMEOUT", "seconds a process waits for the embedded storage's lock", ge=0
    )
    upsert_batch: int = _var(256, "DOCQUEUE_QDRANT_BATCH", "points per upsert", ge=1)
    request_timeout_s: float = _var(30.0, "DOCQUEUE_QDRANT_TIMEOUT", "seconds per request to a Qdrant server", gt=0)
    linger_s: float = _var(
        2.0,
        "DOCQUEUE_QDRANT_LINGER",
        "seconds the embedded store stays open after a write, so a run's batches share one "
        "opening; a process waiting for it is let in at once",
        ge=0,
    )
    migrate_batch: int = _var(
        1000,
        "DOCQUEUE_QDRANT_MIGRATE_BATCH",
        "points copied per batch when `db upgrade` moves an old embedded folder",
        ge=1,
    )
    hybrid_candidates: int = _var(
        50,
        "DOCQUEUE_QDRANT_HYBRID_CANDIDATES",
        "hits each of dense and sparse search hands to the fusion of a hybrid search",
        ge=1,
        le=1000,
    )
    segment_points: int = _var(
        200_000,
        "DOCQUEUE_QDRANT_SEGMENT_POINTS",
        "most points in one indexed segment of the embedded store: bounds the time and memory "
        "of one index build, whatever the corpus holds",
        ge=10_000,
    )
    index_tail: int = _var(
        50_000,
        "DOCQUEUE_QDRANT_INDEX_TAIL",
        "points written since the last index build after which a recovery run builds their "
        "index; 0 = the nightly run only",
        ge=0,
    )
    hnsw_ef: int = _var(
        128,
        "DOCQUEUE_QDRANT_HNSW_EF",
        "candidates a dense search of the embedded store visits in its HNSW graph (higher: better recall, slower)",
        ge=4,
        le=4096,
    )


class GraphConfig(SettingsGroup):
    title: ClassVar[str] = "Knowledge graph (Bolt)"

    uri: str = _var(
        "",
        "DOCQUEUE_NEO4J_URI",
        "a Neo4j 5 (or any Bolt server); unset = the embedded ArcadeDB Bolt server",
        shown="embedded",
    )
    user: str = _var("neo4j", "DOCQUEUE_NEO4J_USER", "user on that server")
    password: Optional[SecretStr] = _var(None, "DOCQUEUE_NEO4J_PASSWORD", "its password", shown="unset")
    database: str = _var("", "DOCQUEUE_NEO4J_DATABASE", "database on that server", shown="the server's default")
    batch_size: int = _var(100, "DOCQUEUE_GRAPH_BATCH_SIZE", "chunks per graph transaction", ge=1)
    conflict_retries: int = _var(
        5, "DOCQUEUE_GRAPH_CONFLICT_RETRIES", "retries of a transaction that met a concurrent write", ge=0
    )
    tx_timeout_s: float = _var(
        30.0, "DOCQUEUE_GRAPH_TX_TIMEOUT_S", "seconds a graph transaction may keep retrying", gt=0
    )
    bolt_port: int = _var(
        0,
        "DOCQUEUE_BOLT_PORT",
        "port of the embedded Bolt server; unset: a free port chosen on the first start and recorded in the home",
        shown="a free port, per home",
        ge=0,
        le=65535,
    )
    bolt_heap_mb: int = _var(512, "DOCQUEUE_BOLT_HEAP_MB", "JVM heap of the embedded Bolt server (MB)", ge=64)
    bolt_java_opts: str = _var("", "DOCQUEUE_BOLT_JAVA_OPTS", "extra JVM options for the embedded Bolt server")
    cli_retry_s: float = _var(
        5.0, "DOCQUEUE_CLI_GRAPH_RETRY_S", "seconds CLI commands retry an unreachable graph server", ge=0
    )


class ExtractionConfig(SettingsGroup):
    title: ClassVar[str] = "Entity extraction"

    extractor: str = _var("spacy", "DOCQUEUE_EXTRACTOR", "`spacy` (offline) or `llm`")
    max_chars: int = _var(20_000, "DOCQUEUE_EXTRACT_MAX_CHARS", "characters per chunk fed to the extractor", ge=1)
    batch_size: int = _var(16, "DOCQUEUE_EXTRACT_BATCH_SIZE", "texts per spaCy batch", ge=1)
    max_entities: int = _var(100, "DOCQUEUE_EXTRACT_MAX_ENTITIES", "entities kept per chunk", ge=1)
    max_relations: int = _var(300, "DOCQUEUE_EXTRACT_MAX_RELATIONS", "relations kept per chunk", ge=0)
    max_sentence_entities: int = _var(
        12, "DOCQUEUE_EXTRACT_MAX_SENTENCE_ENTITIES", "entities of a sentence paired as co-occurrences", ge=1
    )
    timeout_s: float = _var(
        600.0, "DOCQUEUE_EXTRACT_TIMEOUT", "seconds per extraction batch before it fails as `timeout`", gt=0
    )
    llm_base_url: str = _var(
        "",
        "DOCQUEUE_LLM_BASE_URL",
        "any OpenAI-compatible chat-completions endpoint (JSON-schema output, validated)",
        shown="unset",
    )
    llm_model: str = _var("", "DOCQUEUE_LLM_MODEL", "model name at that endpoint", shown="unset")
    llm_api_key: Optional[SecretStr] = _var(None, "DOCQUEUE_LLM_API_KEY", "its API key", shown="unset")
    llm_timeout_s: float = _var(60.0, "DOCQUEUE_LLM_TIMEOUT_S", "seconds per LLM request", gt=0)
    llm_max_tokens: int = _var(2048, "DOCQUEUE_LLM_MAX_TOKENS", "tokens per LLM answer", ge=1)
    llm_max_retries: int = _var(2, "DOCQUEUE_LLM_MAX_RETRIES", "retries of a failed LLM request", ge=0)
    llm_concurrency: int = _var(2, "DOCQUEUE_LLM_CONCURRENCY", "LLM requests in flight", ge=1)

    @field_validator("extractor")
    @classmethod
    def _known_extractor(cls, value: str) -> str:
        value = value.lower()
        if value not in ("spacy", "llm"):
            raise ValueError(f"names an unknown extractor {value!r} (use spacy or llm)")
        return value


class DagsterConfig(SettingsGroup):
    title: ClassVar[str] = "Dagster sensors, schedules and runs"

    sensor_interval_s: int = _var(15, "DOCQUEUE_SENSOR_INTERVAL", "seconds between sensor ticks", ge=1)
    sensor_max_runs: int = _var(10, "DOCQUEUE_SENSOR_MAX_RUNS", "run requests per sensor tick", ge=1)
    nightly_cron: str = _var("0 3 * * *", "DOCQUEUE_NIGHTLY_CRON", "when the nightly reconciliation runs")
    checks_cron: str = _var(
        "30 3 * * *", "DOCQUEUE_CHECKS_CRON", "when every asset check is evaluated (after the nightly reconciliation)"
    )
    # keys per run: large enough that Dagster's per-run cost is a small share, small enough to retry cheaply
    max_keys_ocr_document: int = _var(50, "DOCQUEUE_RUN_MAX_KEYS_OCR_DOCUMENT", "partitions per OCR_DOCUMENT run", ge=1)
    max_keys_ocr_page: int = _var(100, "DOCQUEUE_RUN_MAX_KEYS_OCR_PAGE", "partitions per OCR_PAGE run", ge=1)
    max_keys_vector_page: int = _var(200, "DOCQUEUE_RUN_MAX_KEYS_VECTOR_PAGE", "partitions per VECTOR_PAGE run", ge=1)
    max_keys_vector_chunk: int = _var(
        1000, "DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK", "partitions per VECTOR_CHUNK run", ge=1
    )
    max_keys_graphrag_chunk: int = _var(
        1000, "DOCQUEUE_RUN_MAX_KEYS_GRAPHRAG_CHUNK", "partitions per GRAPHRAG_CHUNK run", ge=1
    )
    # Dagster loads every key of a partitions definition to resolve a ranged run: the live set is kept bounded
    partition_retention_s: float = _var(
        7 * 86400.0,
        "DOCQUEUE_PARTITION_RETENTION",
        "how long the Dagster partition of a completed page or chunk "
        "stays (`90m`, `12h`, `7d`; a bare number is seconds); the queue keeps the task",
        shown="`7d`",
    )
    partition_max_completed: int = _var(
        10_000,
        "DOCQUEUE_PARTITION_MAX_COMPLETED",
        "completed page or chunk partitions kept live per definition, newest first",
        ge=0,
    )
    partition_retire_batch: int = _var(
        5000, "DOCQUEUE_PARTITION_RETIRE_BATCH", "partitions retired per definition per recovery run", ge=1
    )
    verify_page: int = _var(
        1000,
        "DOCQUEUE_VERIFY_PAGE",
        "chunk ids verify, the nightly run and the asset checks read from a store at a time",
        ge=1,
    )

    @field_validator("partition_retention_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("nightly_cron", "checks_cron")
    @classmethod
    def _five_fields(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError(f"must be a cron expression of five fields, got {value!r}")
        return value

    def max_keys_per_run(self, kind_name: str) -> int:
        return getattr(self, f"max_keys_{kind_name.lower()}")


class IntakeConfig(SettingsGroup):
    title: ClassVar[str] = "Intake (inbox folder and S3)"

    inbox: str = _var(
        "",
        "DOCQUEUE_INBOX",
        "a folder the inbox sensor watches; new and changed files are registered "
        "(read again only when their size or modification time changed; a file moved within it "
        "keeps its document)",
        shown="unset",
    )
    inbox_max_files: int = _var(500, "DOCQUEUE_INBOX_MAX_FILES", "files the inbox sensor registers per tick", ge=1)
    s3_url: str = _var("", "DOCQUEUE_S3_URL", "endpoint of the S3-compatible service", shown="unset (AWS)")
    s3_bucket: str = _var("", "DOCQUEUE_S3_BUCKET", "the bucket the S3 sensor watches", shown="unset")
    s3_prefix: str = _var("", "DOCQUEUE_S3_PREFIX", "the prefix watched in that bucket", shown='`""`')
    s3_max_objects: int = _var(50, "DOCQUEUE_S3_MAX_OBJECTS", "objects downloaded and registered per tick", ge=1)
    s3_max_list: int = _var(
        100_000,
        "DOCQUEUE_S3_MAX_LIST",
        "objects a tick may list; past it the tick refuses (narrow the prefix) rather than miss objects",
        ge=1,
    )
    s3_lookback_s: float = _var(
        900.0,
        "DOCQUEUE_S3_LOOKBACK",
        "seconds before the newest handled `LastModified` in which late objects are still taken",
        ge=0,
    )
    s3_timeout_s: float = _var(60.0, "DOCQUEUE_S3_TIMEOUT", "connect and read timeout per request (3 attempts)", gt=0)
    # the AWS SDK's own name, read here because boto3 itself reads only AWS_DEFAULT_REGION
    s3_region: str = _var(
        "",
        "AWS_REGION",
        "region of the S3 bucket",
        shown="unset: boto3's own (`AWS_DEFAULT_REGION`, `~/.aws/config`), else us-east-1",
    )


class ClusterConfig(SettingsGroup):
    title: ClassVar[str] = "Several machines (Celery)"

    executor: str = _var(
        "",
        "DOCQUEUE_EXECUTOR",
        "`celery`: every run's steps go to Celery workers (cluster mode); unset: in the run's own process",
        shown="unset",
    )
    broker_url: Optional[SecretStr] = _var(
        None,
        "DOCQUEUE_BROKER_URL",
        "the Celery broker, `redis://host:6379/0` or `amqp://user:pass@host//`",
        shown="unset",
    )
    celery_backend: Optional[SecretStr] = _var(
        None,
        "DOCQUEUE_CELERY_BACKEND",
        "where step results go; unset: the broker when it is Redis, else rpc",
        shown="unset",
    )
    celery_visibility_timeout_s: float = _var(
        3600.0,
        "DOCQUEUE_CELERY_VISIBILITY_TIMEOUT",
        "seconds before Redis hands a step whose worker died to another worker",
        ge=1,
    )
    celery_poll_interval_s: float = _var(
        0.1,
        "DOCQUEUE_CELERY_POLL_INTERVAL",
        "seconds between a run's checks for its step's result (dagster-celery's own is 1 s)",
        gt=0,
        le=10,
    )
    phase_run_limits: str = _var(
        "",
        "DOCQUEUE_PHASE_RUN_LIMITS",
        "`ocr=8,vector=4,graphrag=2`: each phase's pool limit (runs of it at once), kept in "
        "Dagster's storage for every machine",
        shown="1 each",
    )
    dagster_yaml: str = _var(
        "",
        "DOCQUEUE_DAGSTER_YAML",
        "another instance config to write to DAGSTER_HOME (e.g. deploy/k8s/dagster.yaml)",
        shown="the repository's `dagster.yaml`",
    )


class TenantConfig(SettingsGroup):
    title: ClassVar[str] = "Tenants"

    default_tenant: str = _var(
        "default",
        "DOCQUEUE_DEFAULT_TENANT",
        "the tenant of documents registered without one (`ingest`, the inbox and S3 "
        "sensors, the library) and of `search` and `graph` without `--tenant`",
    )
    delete_batch: int = _var(
        100, "DOCQUEUE_DELETE_BATCH", "documents `docqueue delete --tenant` removes per batch", ge=1, le=10_000
    )

    @field_validator("default_tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        if tenant_problem(value):
            raise ValueError(f"must be {TENANT_RULE}, got {value!r}")
        return value


ALL_GROUPS: tuple[type[SettingsGroup], ...] = (
    QueueConfig,
    DatabaseConfig,
    StorageConfig,
    EmbeddingConfig,
    VectorStoreConfig,
    GraphConfig,
    ExtractionConfig,
    DagsterConfig,
    IntakeConfig,
    ClusterConfig,
    TenantConfig,
)

G = TypeVar("G", bound=SettingsGroup)
_CACHE: dict[type, tuple[tuple, SettingsGroup]] = {}
_CACHE_LOCK = threading.Lock()


def settings(group: type[G]) -> G:
    """The group as the current environment sets it, rebuilt only when one of its variables changed."""
    names = group.variables()
    key = tuple(os.environ.get(name) for name in names)
    cached = _CACHE.get(group)
    if cached is not None and cached[0] == key:
        return cached[1]  # type: ignore[return-value]
    try:
        built = group()
    except ValidationError as exc:
        raise SettingsError(_sentence(group, exc), exc.error_count()) from None
    with _CACHE_LOCK:
        _CACHE[group] = (key, built)
    return built


def validate_settings() -> None:
    """Build every group once; the first bad value raises SettingsError (with a count of any others)."""
    problems: list[SettingsError] = []
    for group in ALL_GROUPS:
        try:
            settings(group)
        except SettingsError as exc:
            problems.append(exc)
    if problems:
        invalid = sum(problem.invalid for problem in problems)
        more = f" (and {invalid - 1} more invalid setting{'s' if invalid > 2 else ''})" if invalid > 1 else ""
        raise SettingsError(f"{problems[0]}{more}", invalid)


@dataclass(frozen=True)
class Settings:
    """Every group, built once from the environment by an entry point (the CLI, the Dagster code location, a
    Celery worker, a bench) and handed down: below the entry points nothing reads the environment."""

    queue: QueueConfig
    database: DatabaseConfig
    storage: StorageConfig
    embedding: EmbeddingConfig
    vector: VectorStoreConfig
    graph: GraphConfig
    extraction: ExtractionConfig
    dagster: DagsterConfig
    intake: IntakeConfig
    cluster: ClusterConfig
    tenant: TenantConfig

    @classmethod
    def from_env(cls) -> "Settings":
        """All groups from the current environment; the first bad value raises SettingsError (one sentence naming
        the variable, with a count of any others)."""
        validate_settings()
        return cls(
            queue=settings(QueueConfig),
            database=settings(DatabaseConfig),
            storage=settings(StorageConfig),
            embedding=settings(EmbeddingConfig),
            vector=settings(VectorStoreConfig),
            graph=settings(GraphConfig),
            extraction=settings(ExtractionConfig),
            dagster=settings(DagsterConfig),
            intake=settings(IntakeConfig),
            cluster=settings(ClusterConfig),
            tenant=settings(TenantConfig),
        )


@dataclass(frozen=True)
class QueueSettings:
    poll_interval_s: float = default(QueueConfig, "poll_interval_s")
    heartbeat_interval_s: float = default(QueueConfig, "heartbeat_interval_s")
    stale_timeout_s: float = default(QueueConfig, "stale_timeout_s")
    max_retries: int = default(QueueConfig, "max_retries")
    # back-off before a failed task may be claimed again (the default queue_db.phases.RetryPolicy)
    retry_backoff_base_s: float = default(QueueConfig, "retry_backoff_base_s")
    retry_backoff_max_s: float = default(QueueConfig, "retry_backoff_max_s")
    claim_batch_size: int = 50  # no variable: ranged runs claim per task kind (assets.common.CLAIM_BATCH)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, queue: QueueConfig) -> "QueueSettings":
        return cls(
            poll_interval_s=queue.poll_interval_s,
            heartbeat_interval_s=queue.heartbeat_interval_s,
            stale_timeout_s=queue.stale_timeout_s,
            max_retries=queue.max_retries,
            retry_backoff_base_s=queue.retry_backoff_base_s,
            retry_backoff_max_s=queue.retry_backoff_max_s,
        )
