"""What processing a task yields (`Outcome`), the bounds a page is read and cut within (`PageLimits`), and the
small rules that turn a task's data into them, shared by the pipeline and the assets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from orchestration.failures import SERVICE_ERROR_CLASSES, classify
from processing.chunking import MAX_CHUNKS_PER_PAGE
from processing.office_pages import OfficeLimits
from processing.text_pages import TextLimits
from queue_db.config import StorageConfig


@dataclass
class Outcome:
    id: str
    ok: bool
    error: str | None = None
    error_class: str | None = None
    retryable: bool = True
    metadata: dict = field(default_factory=dict)
    rejected: bool = False  # the queue refused the transition: the task was no longer ours


@dataclass(frozen=True)
class VectorCopy:
    """A chunk's vector copied from the chunk `source` (a chunk_id) of the same text instead of embedded."""

    source: str
    vector: list[float] | None = None
    tokens: int = 0
    embedded_tokens: int = 0
    batch_index: int | None = None  # the source is this earlier task of the same batch, embedded now

    def of(self, vector, tokens: int, embedded_tokens: int) -> "VectorCopy":
        return VectorCopy(self.source, vector, tokens, embedded_tokens)


@dataclass(frozen=True)
class PageLimits:
    """The bounds of reading a text or office file into pages and of cutting a page into chunks, as the entry point's
    settings give them (DOCQUEUE_TEXT_PAGE_CHARS, DOCQUEUE_SHEET_PAGE_ROWS, DOCQUEUE_MAX_CHUNKS_PER_PAGE, ...)."""

    text: TextLimits = field(default_factory=TextLimits)
    office: OfficeLimits = field(default_factory=OfficeLimits)
    max_chunks_per_page: int = MAX_CHUNKS_PER_PAGE

    @classmethod
    def from_config(cls, storage: StorageConfig) -> "PageLimits":
        return cls(TextLimits.from_config(storage), OfficeLimits.from_config(storage), storage.max_chunks_per_page)


def textless_outcome(task: dict) -> Outcome:
    if task.get("content") is None:  # a chunk carried over from the legacy schema, which kept no chunk text
        return Outcome(
            task["id"],
            False,
            "legacy: this chunk's text was never stored (it came from the legacy "
            "schema); re-ingest its document to chunk it again",
            "legacy",
            False,
        )
    return Outcome(task["id"], False, "empty: this chunk's text is blank", "empty", False)


def json_safe(value):
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value.replace("\x00", "") if isinstance(value, str) else value
    return str(value)


ISOLATION_PROBES = 2


def one_by_one(worker_id: str, tasks: Sequence[dict], work) -> tuple[list[Outcome], dict[str, dict]]:
    """Each task alone. When the first ISOLATION_PROBES tasks all fail, the cause is not one chunk's content
    (a broken model or endpoint): the rest fail with that error untried, bounding the extra calls."""
    outcomes, results = [], {}
    for index, task in enumerate(tasks):
        if index >= ISOLATION_PROBES and not any(o.ok for o in outcomes):
            first = outcomes[0]
            outcomes += [
                Outcome(t["id"], False, first.error, first.error_class, first.retryable) for t in tasks[index:]
            ]
            break
        try:
            done, extra = work(worker_id, [task])
            outcomes += done
            results.update(extra)
        except Exception as exc:  # noqa: BLE001 - this task's own failure
            reason, error_class, retryable = classify(exc)
            outcomes.append(Outcome(task["id"], False, reason, error_class, retryable))
    return outcomes, results


def batch_then_one_by_one(worker_id: str, tasks: Sequence[dict], work) -> tuple[list[Outcome], dict[str, dict]]:
    """`work` over the whole batch. A batch failing for a reason that may lie in one task (not an unreachable
    service, not a time limit) is redone one task at a time (one_by_one), so one bad task fails alone instead of
    failing, and spending a retry of, every other task of its batch."""
    try:
        return work(worker_id, tasks)
    except Exception as exc:  # noqa: BLE001 - the store or model failing fails the batch, retryably
        reason, error_class, retryable = classify(exc)
        if len(tasks) == 1 or error_class in SERVICE_ERROR_CLASSES:
            return [Outcome(t["id"], False, reason, error_class, retryable) for t in tasks], {}
        return one_by_one(worker_id, tasks, work)


def write_chunked_pages(queue, worker_id: str, chunked: dict[str, list[dict]]) -> dict[str, Outcome]:
    """Each page's chunk tasks written (TaskQueue.complete_chunkings, the batch in one transaction, page by page
    when it fails: batch_then_one_by_one): page -> its write's outcome, `rejected` when its claim was no longer
    held."""

    def write(worker_id: str, pages: Sequence[dict]) -> tuple[list[Outcome], dict[str, dict]]:
        accepted = queue.complete_chunkings(worker_id, {p["id"]: p["chunks"] for p in pages})
        return [Outcome(p["id"], True, rejected=p["id"] not in accepted) for p in pages], {}

    pages = [{"id": page, "chunks": chunks} for page, chunks in chunked.items()]
    outcomes, _ = batch_then_one_by_one(worker_id, pages, write) if pages else ([], {})
    return {o.id: o for o in outcomes}
