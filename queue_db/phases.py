"""The phases of the pipeline: OCR, vector index and GraphRAG, their five task kinds, and `PHASES`, the registry
of them a queue serves by default. What a phase and a kind are, and the SQL their facts make, is queue_db.phase_spec;
its names are re-exported here, where the rest of the code asks for them."""

from __future__ import annotations

from typing import Iterator

from queue_db.phase_spec import EXPANDED_SQL as EXPANDED_SQL
from queue_db.phase_spec import NEVER as NEVER
from queue_db.phase_spec import TABLE_OF_LEVEL as TABLE_OF_LEVEL
from queue_db.phase_spec import Level as Level
from queue_db.phase_spec import PhaseRegistry as PhaseRegistry
from queue_db.phase_spec import PhaseSpec as PhaseSpec
from queue_db.phase_spec import TaskKind as TaskKind
from queue_db.phase_spec import claim_index_name as claim_index_name
from queue_db.phase_spec import short_table as short_table

OCR_DOCUMENT = TaskKind(
    name="ocr_document",
    level=Level.DOCUMENT,
    table="documents",
    prefix="ocr",
    ready_sql="t.pages_created_at IS NULL",
    owns_sql="t.pages_created_at IS NULL",
    label="documents",
    returning=(
        "id",
        "document_key",
        "filename",
        "storage_key",
        "source_path",
        "password_ref",
        "mime_type",
        "retry_count",
        "max_retries",
    ),
    column_overrides={
        "worker_id": "current_worker_id",
        "retry_count": "retry_count",
        "last_heartbeat": "last_heartbeat",
        "next_attempt_at": "next_attempt_at",
        "completed_at": "pages_created_at",
    },
)
OCR_PAGE = TaskKind(
    name="ocr_page",
    level=Level.PAGE,
    table="task_queue_page",
    prefix="ocr",
    ready_sql="TRUE",
    label="ocr_pages",
    returning=("id", "document_id", "page_number", "ocr_retry_count", "max_retries"),
    result_columns={"page_file_path": "text", "ocr_method": "text", "ocr_chars": "int", "ocr_seconds": "real"},
)
VECTOR_PAGE = TaskKind(
    name="vector_page",
    level=Level.PAGE,
    table="task_queue_page",
    prefix="vector",
    ready_sql="t.chunked_at IS NULL AND t.ocr_status = 'completed'",
    owns_sql="t.chunked_at IS NULL",
    label="chunking_pages",
    ready_since_sql="t.ocr_completed_at",
    column_overrides={"completed_at": "chunked_at"},
    returning=("id", "document_id", "page_number", "page_file_path", "vector_retry_count", "max_retries"),
)
VECTOR_CHUNK = TaskKind(
    name="vector_chunk",
    level=Level.CHUNK,
    table="task_queue_chunk",
    prefix="vector",
    # seed: "only where parent page OCR is completed". OFFSET 0 keeps the gate a probe of the page's primary key
    # per chunk row: without it the planner may hash every OCR-completed page once (a whole-table scan of the page
    # table) wherever the gate sits inside an OR, as in work_left_sql (tests/integration/test_tick_plans.py)
    ready_sql="EXISTS (SELECT 1 FROM task_queue_page gate WHERE gate.id = t.page_id AND gate.ocr_status = 'completed' "
    "OFFSET 0)",
    label="vector_chunks",
    returning=(
        "id",
        "page_id",
        "document_id",
        "chunk_id",
        "chunk_index",
        "chunk_content_hash",
        "content",
        "vector_retry_count",
        "max_retries",
    ),
    result_columns={"vector_seconds": "real", "vector_reused_from": "text"},
)
GRAPHRAG_CHUNK = TaskKind(
    name="graphrag_chunk",
    level=Level.CHUNK,
    table="task_queue_chunk",
    prefix="graphrag",
    ready_sql="t.vector_status = 'completed'",
    label="graphrag_chunks",
    ready_since_sql="t.vector_completed_at",
    returning=(
        "id",
        "page_id",
        "document_id",
        "chunk_id",
        "chunk_index",
        "chunk_content_hash",
        "content",
        "graphrag_retry_count",
        "max_retries",
    ),
    result_columns={"entities_extracted": "int", "relationships_extracted": "int", "graphrag_seconds": "real"},
)

# a page's chunking waits for its OCR, a chunk's GraphRAG task for its embedding (the same row's earlier phase)
object.__setattr__(VECTOR_PAGE, "depends_on", OCR_PAGE)
object.__setattr__(GRAPHRAG_CHUNK, "depends_on", VECTOR_CHUNK)
# the chunk claim's gate reads the page table, which no index predicate may: the index covers the rest
object.__setattr__(VECTOR_CHUNK, "index_gate_sql", "TRUE")
object.__setattr__(OCR_DOCUMENT, "claim_index", "idx_documents_expand_claim")

OCR = PhaseSpec(
    "ocr", (OCR_DOCUMENT, OCR_PAGE), document_status_column="ocr_status", pool="ocr", celery_queue="ocr", handler="ocr"
)
VECTOR = PhaseSpec(
    "vector",
    (VECTOR_PAGE, VECTOR_CHUNK),
    document_status_column="vector_index_status",
    pool="vector",
    celery_queue="vector",
    handler="vector",
)
GRAPHRAG = PhaseSpec(
    "graphrag",
    (GRAPHRAG_CHUNK,),
    document_status_column="graphrag_index_status",
    pool="graphrag",
    celery_queue="graphrag",
    handler="graphrag",
)

PHASES = PhaseRegistry((OCR, VECTOR, GRAPHRAG))


class _PhaseAccess(type):
    """`Phase.OCR`, `Phase("ocr")`, `for phase in Phase`: the default phases, addressed as an enum was."""

    def __iter__(cls) -> Iterator[PhaseSpec]:
        return iter(PHASES)

    def __len__(cls) -> int:
        return len(PHASES)

    def __call__(cls, name: "str | PhaseSpec") -> PhaseSpec:
        return PHASES.phase(name)


class Phase(metaclass=_PhaseAccess):
    OCR = OCR
    VECTOR = VECTOR
    GRAPHRAG = GRAPHRAG


ALL_KINDS: tuple[TaskKind, ...] = PHASES.kinds
KINDS_BY_NAME = {kind.name: kind for kind in ALL_KINDS}


def kinds_of_phase(phase: PhaseSpec) -> tuple[TaskKind, ...]:
    return phase.kinds


def blocked_phase_sql(phase: PhaseSpec, alias: str = "d", phases: PhaseRegistry = PHASES) -> str:
    """Over a documents row: its `phase` is blocked (PhaseRegistry.blocked_phase_sql)."""
    return phases.blocked_phase_sql(phase, alias)


def leaf_kind(phase: PhaseSpec) -> TaskKind:
    """The phase's kind at the deepest level: its tasks are the phase's units of work."""
    return phase.leaf
