"""Idempotency keys of document registration (migration 0013, TaskQueue.register_document) on real PostgreSQL,
through SQLAlchemy's pooled engine and through queue_db.direct_engine (what `docqueue ingest` registers with)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from queue_db.direct_engine import DirectEngine
from queue_db.idempotency import IdempotencyConflict
from queue_db.queue import TaskQueue
from tests.queue_support import new_hash


@pytest.fixture(params=["pooled", "direct"])
def queue(request, engine, database_url, settings):
    if request.param == "pooled":
        yield TaskQueue(engine, settings)
        return
    direct = DirectEngine(database_url)
    yield TaskQueue(direct, settings)
    direct.dispose()


def register(queue, content: str, **kwargs):
    return queue.register_document(
        filename=kwargs.pop("filename", "note.md"),
        content_hash=new_hash(content),
        size_bytes=len(content),
        mime_type="text/markdown",
        **kwargs,
    )


def document_count(queue) -> int:
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM documents").scalar()


def test_the_same_key_twice_is_one_document(queue):
    first, created = register(queue, "minutes of the board", idempotency_key="request-17")
    again, created_again = register(queue, "minutes of the board", filename="renamed.md", idempotency_key="request-17")
    assert created and not created_again
    assert again["id"] == first["id"] and again["filename"] == "note.md"
    assert first["idempotency_key"] == "request-17"
    assert document_count(queue) == 1


def test_the_same_key_with_other_bytes_is_refused_and_changes_nothing(queue):
    first, _ = register(queue, "version one", idempotency_key="upload-1")
    with pytest.raises(IdempotencyConflict) as refused:
        register(queue, "version two", idempotency_key="upload-1")
    assert str(refused.value) == (
        f"idempotency key 'upload-1' was already used for different content (document {first['document_key']})"
    )
    assert document_count(queue) == 1
    assert queue.document(str(first["id"]))["content_hash"] == new_hash("version one")


def test_content_hash_deduplication_stays_and_the_key_then_names_those_bytes(queue):
    plain, _ = register(queue, "shared bytes")  # registered before anyone used a key
    keyed, created = register(queue, "shared bytes", idempotency_key="k-shared")
    assert not created and keyed["id"] == plain["id"] and keyed["idempotency_key"] == "k-shared"
    # the key now names those bytes: other content under it is refused
    with pytest.raises(IdempotencyConflict):
        register(queue, "something else", idempotency_key="k-shared")
    # bytes already under one key stay one document when registered under another
    other, created = register(queue, "shared bytes", idempotency_key="k-other")
    assert not created and other["id"] == plain["id"] and other["idempotency_key"] == "k-shared"
    # different keys with different bytes, and documents without keys, are independent
    register(queue, "third", idempotency_key="k-third")
    register(queue, "fourth")
    register(queue, "fifth")
    assert document_count(queue) == 4


@pytest.mark.parametrize(
    "key, rule",
    [("", "non-empty"), ("   ", "non-empty"), ("x" * 256, "at most 255"), ("line\nbreak", "control characters")],
)
def test_invalid_keys_are_refused_before_anything_is_written(queue, key, rule):
    with pytest.raises(ValueError, match=rule):
        register(queue, "content", idempotency_key=key)
    assert document_count(queue) == 0


def test_concurrent_registrations_with_one_key_give_one_document_and_refuse_the_rest(queue):
    """Eight writers race with the same key: four send the same bytes, four send other bytes each."""
    contents = ["the agreed bytes"] * 4 + [f"intruder {n}" for n in range(4)]

    def attempt(content: str):
        try:
            row, created = register(queue, content, idempotency_key="race")
            return ("ok", str(row["id"]), created, content)
        except IdempotencyConflict:
            return ("refused", None, False, content)

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, contents))
    accepted = [o for o in outcomes if o[0] == "ok"]
    assert len({o[1] for o in accepted}) == 1 and sum(o[2] for o in accepted) == 1
    winner = {o[3] for o in accepted}
    assert len(winner) == 1  # only the winning content is ever accepted, every other content is refused
    assert all(o[3] not in winner for o in outcomes if o[0] == "refused")
    assert document_count(queue) == 1
