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
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional, TypeVar

from pydantic import SecretStr, ValidationError, field_validator

from queue_db.service_config import (
    ClusterConfig,
    DagsterConfig,
    EmbeddingConfig,
    ExtractionConfig,
    GraphConfig,
    IntakeConfig,
    VectorStoreConfig,
)
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
        "seconds `docqueue run` waits, at most, before looking for work again when none is ready (another runner's "
        "news of a run's end ends the wait sooner)",
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


PDF_FALLBACKS = ("pdfium", "off")
# Tesseract's language names (eng, rus, chi_sim, ...) joined by `+`, the form its `-l` option takes
OCR_LANGUAGES_RULE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\+[A-Za-z][A-Za-z0-9_]*)*")


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
    max_unmapped_share: float = _var(
        0.3,
        "DOCQUEUE_MAX_UNMAPPED_SHARE",
        "a page whose text layer has a larger share of characters its fonts cannot map to unicode (U+FFFD, "
        "control codes) is OCR'd",
        gt=0,
        le=1,
    )
    max_lookalike_share: float = _var(
        0.2,
        "DOCQUEUE_MAX_LOOKALIKE_SHARE",
        "with DOCQUEUE_OCR_LANGUAGES naming a Cyrillic or Greek language: a page whose text layer is an earlier OCR's "
        "(hidden text over the page's picture) and has a larger share of Latin words with capitals inside them "
        "(`AeKnapai`: Cyrillic read as Latin look-alikes) is OCR'd again",
        gt=0,
        le=1,
    )
    ocr_threads: int = _var(
        min(2, os.cpu_count() or 1),
        "DOCQUEUE_OCR_THREADS",
        "threads of the OCR engine",
        shown="2 (1 on one core)",
        gt=0,
    )
    ocr_languages: str = _var(
        "",
        "DOCQUEUE_OCR_LANGUAGES",
        "Tesseract's languages for pages read by OCR, joined by `+` (`eng+rus`; each needs its Debian package "
        "`tesseract-ocr-<language>`): set, Tesseract reads those pages instead of RapidOCR, whose bundled model "
        "reads Latin script only",
        shown="unset: RapidOCR",
    )
    worker_start_timeout_s: float = _var(
        60.0, "DOCQUEUE_WORKER_START_TIMEOUT", "seconds the conversion process may take to start", gt=0
    )
    pdf_fallback: str = _var(
        "pdfium",
        "DOCQUEUE_PDF_FALLBACK",
        "the second engine a PDF is given to when PyMuPDF cannot open it or finds no pages in it: `pdfium`, "
        "or `off` to fail it at once",
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

    @field_validator("pdf_fallback")
    @classmethod
    def _known_fallback(cls, value: str) -> str:
        value = value.lower()
        if value not in PDF_FALLBACKS:
            raise ValueError(f"names an unknown PDF engine {value!r} (use {' or '.join(PDF_FALLBACKS)})")
        return value

    @field_validator("ocr_languages")
    @classmethod
    def _language_names(cls, value: str) -> str:
        if value and not OCR_LANGUAGES_RULE.fullmatch(value):
            raise ValueError(f"must be Tesseract language names joined by + (such as eng+rus), got {value!r}")
        return value


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


class NearDuplicateConfig(SettingsGroup):
    title: ClassVar[str] = "Near-duplicate documents"

    enabled: bool = _var(
        True,
        "DOCQUEUE_NEAR_DUP",
        "`false`: no similarity signature is computed after OCR and no content group is formed",
    )
    # 0.7 from bench/near_duplicates.py: planted copies (a word changed per page, 2 % OCR errors) group with
    # precision 1.0 and recall 1.0 (the lowest 0.80), while documents sharing all pages but one (J ≈ 0.5) estimate
    # at most 0.63
    threshold: float = _var(
        0.7,
        "DOCQUEUE_NEAR_DUP_THRESHOLD",
        "estimated Jaccard similarity of two documents' character shingles from which they are one content group",
        gt=0,
        le=1,
    )
    max_pages: int = _var(200, "DOCQUEUE_NEAR_DUP_MAX_PAGES", "pages of a document its signature reads", gt=0)
    max_chars: int = _var(
        2_000_000, "DOCQUEUE_NEAR_DUP_MAX_CHARS", "characters of page text a document's signature reads", gt=0
    )
    # six-character shingles: about one distinct shingle per character of text, some 40 pages of prose
    max_shingles: int = _var(
        100_000, "DOCQUEUE_NEAR_DUP_MAX_SHINGLES", "distinct character shingles a document's signature covers", gt=0
    )
    max_candidates: int = _var(
        100,
        "DOCQUEUE_NEAR_DUP_MAX_CANDIDATES",
        "documents read per signature band when looking for a document's near duplicates",
        gt=0,
    )


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
    NearDuplicateConfig,
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
        built = group.from_values(os.environ)
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
    near_duplicates: NearDuplicateConfig

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
            near_duplicates=settings(NearDuplicateConfig),
        )


@dataclass(frozen=True)
class QueueSettings:
    poll_interval_s: float = default(QueueConfig, "poll_interval_s")
    heartbeat_interval_s: float = default(QueueConfig, "heartbeat_interval_s")
    stale_timeout_s: float = default(QueueConfig, "stale_timeout_s")
    max_retries: int = default(QueueConfig, "max_retries")
    # back-off before a failed task may be claimed again (the default queue_db.retry_policy.RetryPolicy)
    retry_backoff_base_s: float = default(QueueConfig, "retry_backoff_base_s")
    retry_backoff_max_s: float = default(QueueConfig, "retry_backoff_max_s")
    claim_batch_size: int = 50  # no variable: ranged runs claim per task kind (assets.common.CLAIM_BATCH)
    # no variable: at most this long between two claims of a kind from the claim index's head by one queue object;
    # the claims between start after the last task it claimed (queue_db.transitions, the claim cursor). 0: every
    # claim starts at the head
    claim_rescan_s: float = 1.0
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
