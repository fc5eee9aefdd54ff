"""Near-duplicate documents: once a document's OCR rolled up complete, its page texts are read back from the file
store, signed (processing/near_duplicates.py) and placed in a content group (queue_db/near_duplicates.py).

It runs in the OCR roll-up, which runs once per document whose OCR reached a final status, and again only when
that roll-up is redone: placing a document is idempotent, so at-least-once execution never duplicates a band row
or a membership. `sign_again` (`docqueue regroup`) signs the documents an older docqueue signed in another format
from their stored page texts, so they can be compared with the documents signed since.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from processing.near_duplicates import FORMAT, SignatureLimits, signature
from queue_db.config import NearDuplicateConfig
from queue_db.near_duplicates import (
    GroupPlacement,
    copies_of,
    forget_signature,
    record_signature,
    signed_in_other_format,
)
from queue_db.queue import TaskQueue
from resources.storage import page_file_key

# the phase whose roll-up places documents in groups: the one that writes the pages' text
GROUPING_PHASE = "ocr"
# the settings' defaults, for callers that hand none in (built without reading the environment)
DEFAULTS = NearDuplicateConfig.model_construct()


def _page_texts(storage, document_key: str, page_count: int, config: NearDuplicateConfig) -> Iterator[str]:
    """The first `max_pages` pages' markdown, `max_chars` characters in all; a page without a file (blank, or
    its markdown removed) reads as nothing."""
    budget = config.max_chars
    for page_number in range(1, min(page_count, config.max_pages) + 1):
        key = page_file_key(document_key, page_number)
        if budget <= 0:
            return
        if storage.exists(key):
            text = storage.get_text(key)[:budget]
            budget -= len(text)
            yield text


def place_documents(
    queue: TaskQueue, storage, documents: Sequence[dict], config: NearDuplicateConfig | None = None
) -> dict[str, GroupPlacement]:
    """Sign each document (rows with id, document_key and pages, as the OCR roll-up reads them) and place it in
    its content group; per document key, where it stands. A document without words gets no signature and stays
    out of every group."""
    config = config if config is not None else DEFAULTS
    if not config.enabled:
        return {}
    limits = SignatureLimits(max_chars=config.max_chars, max_shingles=config.max_shingles)
    placed = {}
    for document in documents:
        texts = _page_texts(storage, document["document_key"], int(document.get("pages") or 0), config)
        signed = signature(texts, limits)
        if signed is None:
            continue
        placed[document["document_key"]] = record_signature(
            queue.engine,
            str(document["id"]),
            signed.values,
            signed.bands(),
            signed.shingles,
            signature_format=FORMAT,
            threshold=config.threshold,
            max_candidates=config.max_candidates,
        )
    return placed


def sign_again(
    queue: TaskQueue, storage, config: NearDuplicateConfig | None = None, batch: int = 500
) -> dict[str, int]:
    """Sign again, in the current format, every document signed in an older one, `batch` at a time, and place
    it as the OCR roll-up would (a document already in a group stays there; one that is not may join one now). A
    document whose text now holds no word loses its old signature. How many were signed, and how many joined a
    group as they were (of two copies signed again, the first is alone when signed and the second joins it: one)."""
    config = config if config is not None else DEFAULTS
    signed = joined = 0
    after = None
    while config.enabled and (rows := signed_in_other_format(queue.engine, FORMAT, after, batch)):
        placed = place_documents(queue, storage, rows, config)
        for row in rows:
            if row["document_key"] not in placed:
                forget_signature(queue.engine, str(row["id"]))
        signed += len(placed)
        joined += sum(1 for placement in placed.values() if placement.group_id is not None)
        after = str(rows[-1]["id"])
    return {"signed": signed, "joined": joined}


def group_metadata(queue: TaskQueue, documents: Sequence[dict]) -> dict[str, dict]:
    """Per document key, what the OCR roll-up's materialization says about the document's group once all of
    them were placed (the Dagster UI shows it): its representative, how many other documents it holds, the
    similarity the document joined with. One query."""
    groups = copies_of(queue.engine, [str(d["id"]) for d in documents])
    metadata = {}
    for document in documents:
        group = groups.get(str(document["id"]))
        metadata[document["document_key"]] = (
            {"content_group": group["representative"], "copies": group["count"], "similarity": group["similarity"]}
            if group
            else {"content_group": "none", "copies": 0}
        )
    return metadata
