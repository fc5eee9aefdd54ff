"""Settings of the systems docqueue drives: the embedder, the vector and graph stores, the extractor, Dagster,
intake and the cluster, one group each (the queue's own groups and the `Settings` aggregate are in
`queue_db.config`)."""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import SecretStr, field_validator

from queue_db.settings_group import SettingsGroup, parse_duration
from queue_db.settings_group import declare as _var


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
    search_entities: int = _var(
        10,
        "DOCQUEUE_SEARCH_ENTITIES_PER_HIT",
        "entities shown beside each search hit, read from the graph in one query per search; 0: search never "
        "reads the graph",
        ge=0,
        le=100,
    )
    search_related: int = _var(
        5,
        "DOCQUEUE_SEARCH_RELATED_PER_HIT",
        "related entities `docqueue search --graph` adds to each hit, strongest relations first",
        ge=0,
        le=100,
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


# keys per run of a kind without its own DOCQUEUE_RUN_MAX_KEYS_<KIND> setting (a phase added by its spec alone)
DEFAULT_MAX_KEYS = 200


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
    run_overhead_share: float = _var(
        0.05,
        "DOCQUEUE_RUN_OVERHEAD_SHARE",
        "the share of a run's work its fixed cost may be: runs are sized from what each kind's runs measure "
        "(seconds a key, seconds before the work), up to DOCQUEUE_RUN_MAX_KEYS_<KIND>, and spread over the runs "
        "that may go at once when little is ready; 0 sizes every run at its maximum",
        ge=0,
        le=1,
    )
    rollup_hold_s: float = _var(
        15.0,
        "DOCQUEUE_ROLLUP_HOLD_S",
        "seconds a document's roll-up may wait while its phase still has runs going, so that one roll-up run "
        "writes many documents; 0 writes each as soon as it is due",
        ge=0,
        le=3600,
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
    partition_key_cache_max: int = _var(
        500_000,
        "DOCQUEUE_PARTITION_KEY_CACHE_MAX",
        "live partition keys per definition a process keeps between Dagster's reads of them, reused while "
        "unchanged (about 100 bytes a key); a larger set is read whole every time; 0 keeps none",
        ge=0,
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
        """DOCQUEUE_RUN_MAX_KEYS_<KIND>: partitions per ranged run of the kind; a kind without its own setting (a
        phase added by its spec alone) takes DEFAULT_MAX_KEYS."""
        return getattr(self, f"max_keys_{kind_name.lower()}", DEFAULT_MAX_KEYS)


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
