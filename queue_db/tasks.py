"""The five kinds of task in the hierarchy and every per-kind fact, in one place.

A kind names its table and the columns of its phase; `claimable_sql` is the claim rule (seed: failed with
retries left first, then pending; fewest retries; oldest; plus docqueue's priority first and a back-off time),
`ready_sql` is the dependency gate (seed "Sequential Dependencies"), and `owns_sql` says whether the row's status
is still the task's own: a document's OCR status and a page's vector status become their children's roll-up once
the document is expanded or the page chunked, and from then on no worker holds them. Every per-kind query (claim,
release, stuck, waiting, held, statistics, retry, requeue, delete) is built from these predicates over
`ALL_KINDS`, so a kind added here reaches all of them. The claim indexes in migrations/0002_docqueue_queue.sql
carry exactly the claim predicates so every claim reads an index in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    OCR = "ocr"
    VECTOR = "vector"
    GRAPHRAG = "graphrag"

    @property
    def document_status_column(self) -> str:
        return {"ocr": "ocr_status", "vector": "vector_index_status", "graphrag": "graphrag_index_status"}[self.value]

    @property
    def previous(self) -> "Phase | None":
        order = list(Phase)
        index = order.index(self)
        return order[index - 1] if index else None


class Level(str, Enum):
    DOCUMENT = "document"
    PAGE = "page"
    CHUNK = "chunk"


@dataclass(frozen=True, eq=False)  # kinds are singletons: identity equality, hashable
class TaskKind:
    name: str
    phase: Phase
    level: Level
    table: str
    prefix: str  # column prefix of this phase on this table
    ready_sql: str  # the dependency gate, over alias t; "TRUE" when none
    label: str  # the kind's name in statistics and read models
    returning: tuple[str, ...]
    # over alias t: the status is the task's own, not yet its children's roll-up
    owns_sql: str = "TRUE"
    # over alias t: when the task became ready (its dependency's completion), where queue wait starts
    ready_since_sql: str = "t.created_at"
    # the kind whose task on the same row must complete first (None: the dependency is elsewhere, or none)
    depends_on: "TaskKind | None" = None
    # columns a completion may set, with their SQL types
    result_columns: dict = field(default_factory=dict)
    # documents use their own names for the expansion task's bookkeeping
    column_overrides: dict = field(default_factory=dict)

    def col(self, what: str) -> str:
        """Column for `what` in (status, worker_id, started_at, completed_at, error, error_class, retry_count,
        last_heartbeat, next_attempt_at)."""
        if what in self.column_overrides:
            return self.column_overrides[what]
        return f"{self.prefix}_{what}"

    @property
    def status(self) -> str:
        return self.col("status")

    @property
    def document_column(self) -> str:
        """The column naming the row's document."""
        return "id" if self.level is Level.DOCUMENT else "document_id"

    def owns(self, alias: str = "t") -> str:
        return _aliased(self.owns_sql, alias)

    def held_sql(self, alias: str = "t") -> str:
        """Rows a worker holds right now: processing, and the status still the task's own."""
        return f"{alias}.{self.status} = 'processing' AND ({self.owns(alias)})"

    def backing_off_sql(self, alias: str = "t") -> str:
        """Failed rows that will be claimable once their back-off ends (not those failed for good)."""
        attempt = f"{alias}.{self.col('next_attempt_at')}"
        return (f"{alias}.{self.status} = 'failed' AND ({self.owns(alias)}) "
                f"AND {alias}.{self.col('retry_count')} < {alias}.max_retries "
                f"AND {attempt} > now() AND {attempt} < '{NEVER}'::timestamptz")

    def failed_for_good_sql(self, alias: str = "t") -> str:
        """Failed rows no automatic retry will take again: out of retries, or failed as not retryable."""
        return (f"{alias}.{self.status} = 'failed' AND ({self.owns(alias)}) "
                f"AND ({alias}.{self.col('retry_count')} >= {alias}.max_retries "
                f"OR {alias}.{self.col('next_attempt_at')} >= '{NEVER}'::timestamptz)")

    def blocked_sql(self, alias: str = "t") -> str:
        """Pending rows that can never become ready: the task they wait for failed for good."""
        if self.depends_on is None:
            return "FALSE"
        return (f"{alias}.{self.status} = 'pending' AND ({self.owns(alias)}) "
                f"AND ({self.depends_on.failed_for_good_sql(alias)})")

    def work_left_sql(self, alias: str = "t") -> str:
        """Rows of this kind that still run without a person acting: ready now, held, or retried after back-off."""
        return f"(({self.claimable_sql(alias)}) OR ({self.held_sql(alias)}) OR ({self.backing_off_sql(alias)}))"

    def claimable_sql(self, alias: str = "t") -> str:
        """Rows this kind may claim now. Textually mirrors the partial claim index predicate."""
        status, retries = f"{alias}.{self.status}", f"{alias}.{self.col('retry_count')}"
        return (
            f"({_aliased(self.ready_sql, alias)}) "
            f"AND ({status} = 'pending' OR ({status} = 'failed' AND {retries} < {alias}.max_retries)) "
            f"AND ({alias}.{self.col('next_attempt_at')} IS NULL OR {alias}.{self.col('next_attempt_at')} <= now())"
        )

    def returning_sql(self, alias: str = "t") -> str:
        """The claim's RETURNING list: the row's columns, and a chunk's text from its own table (migration 0012)."""
        return ", ".join(_RETURNED_ELSEWHERE.get(c, "{a}." + c).format(a=alias) for c in self.returning)

    def claim_order_sql(self, alias: str = "t") -> str:
        return (
            f"{alias}.priority DESC, CASE WHEN {alias}.{self.status} = 'failed' THEN 0 ELSE 1 END, "
            f"{alias}.{self.col('retry_count')}, {alias}.created_at"
        )

    @property
    def parent_levels(self) -> tuple[Level, ...]:
        return {Level.DOCUMENT: (), Level.PAGE: (Level.DOCUMENT,), Level.CHUNK: (Level.PAGE, Level.DOCUMENT)}[self.level]


def _aliased(predicate: str, alias: str) -> str:
    return predicate.replace("t.", alias + ".")


# a failure that is never retried automatically waits until this finite far-future time (drivers cannot load
# 'infinity' into a datetime)
NEVER = "9999-12-31T00:00:00Z"

# returned columns that do not live on the task row
_RETURNED_ELSEWHERE = {
    "content": "(SELECT x.content FROM task_queue_chunk_text x WHERE x.chunk_task_id = {a}.id) AS content",
}

OCR_DOCUMENT = TaskKind(
    name="ocr_document", phase=Phase.OCR, level=Level.DOCUMENT, table="documents", prefix="ocr",
    ready_sql="t.pages_created_at IS NULL", owns_sql="t.pages_created_at IS NULL", label="documents",
    returning=("id", "document_key", "filename", "storage_key", "source_path", "password_ref", "mime_type",
               "retry_count", "max_retries"),
    column_overrides={"worker_id": "current_worker_id", "retry_count": "retry_count",
                      "last_heartbeat": "last_heartbeat", "next_attempt_at": "next_attempt_at",
                      "completed_at": "pages_created_at"},
)
OCR_PAGE = TaskKind(
    name="ocr_page", phase=Phase.OCR, level=Level.PAGE, table="task_queue_page", prefix="ocr",
    ready_sql="TRUE", label="ocr_pages",
    returning=("id", "document_id", "page_number", "ocr_retry_count", "max_retries"),
    result_columns={"page_file_path": "text", "ocr_method": "text", "ocr_chars": "int", "ocr_seconds": "real"},
)
VECTOR_PAGE = TaskKind(
    name="vector_page", phase=Phase.VECTOR, level=Level.PAGE, table="task_queue_page", prefix="vector",
    ready_sql="t.chunked_at IS NULL AND t.ocr_status = 'completed'", owns_sql="t.chunked_at IS NULL",
    label="chunking_pages", ready_since_sql="t.ocr_completed_at", column_overrides={"completed_at": "chunked_at"},
    returning=("id", "document_id", "page_number", "page_file_path", "vector_retry_count", "max_retries"),
)
VECTOR_CHUNK = TaskKind(
    name="vector_chunk", phase=Phase.VECTOR, level=Level.CHUNK, table="task_queue_chunk", prefix="vector",
    # seed: "only where parent page OCR is completed"
    ready_sql="EXISTS (SELECT 1 FROM task_queue_page gate WHERE gate.id = t.page_id AND gate.ocr_status = 'completed')",
    label="vector_chunks",
    returning=("id", "page_id", "document_id", "chunk_id", "chunk_index", "chunk_content_hash", "content",
               "vector_retry_count", "max_retries"),
    result_columns={"vector_seconds": "real", "vector_reused_from": "text"},
)
GRAPHRAG_CHUNK = TaskKind(
    name="graphrag_chunk", phase=Phase.GRAPHRAG, level=Level.CHUNK, table="task_queue_chunk", prefix="graphrag",
    ready_sql="t.vector_status = 'completed'", label="graphrag_chunks", ready_since_sql="t.vector_completed_at",
    returning=("id", "page_id", "document_id", "chunk_id", "chunk_index", "chunk_content_hash", "content",
               "graphrag_retry_count", "max_retries"),
    result_columns={"entities_extracted": "int", "relationships_extracted": "int", "graphrag_seconds": "real"},
)

# a page's chunking waits for its OCR, a chunk's GraphRAG task for its embedding (the same row's earlier phase)
object.__setattr__(VECTOR_PAGE, "depends_on", OCR_PAGE)
object.__setattr__(GRAPHRAG_CHUNK, "depends_on", VECTOR_CHUNK)

ALL_KINDS: tuple[TaskKind, ...] = (OCR_DOCUMENT, OCR_PAGE, VECTOR_PAGE, VECTOR_CHUNK, GRAPHRAG_CHUNK)
KINDS_BY_NAME = {kind.name: kind for kind in ALL_KINDS}


def kinds_of_phase(phase: Phase) -> tuple[TaskKind, ...]:
    return tuple(kind for kind in ALL_KINDS if kind.phase == phase)


def blocked_phase_sql(phase: Phase, alias: str = "d") -> str:
    """Over a documents row: its `phase` is pending and nothing of this phase or an earlier one can still run for
    it, so it waits on a task that failed for good (a derived view; the stored status stays `pending`)."""
    order = list(Phase)
    work = " OR ".join(
        f"EXISTS (SELECT 1 FROM {k.table} w WHERE w.{k.document_column} = {alias}.id AND {k.work_left_sql('w')})"
        for k in ALL_KINDS if order.index(k.phase) <= order.index(phase))
    return f"({alias}.{phase.document_status_column} = 'pending' AND NOT ({work}))"


def leaf_kind(phase: Phase) -> TaskKind:
    """The phase's kind at the deepest level: its tasks are the phase's units of work."""
    levels = list(Level)
    return max(kinds_of_phase(phase), key=lambda kind: levels.index(kind.level))
