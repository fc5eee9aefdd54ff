"""The bubble-up rule, property-tested: for any set of children, the parent equals the seed's rule."""
from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from queue_db.queue import make_worker_id
from tests.queue_support import build_document

STATUSES = ["pending", "processing", "completed", "failed"]


def seed_rule(children: list[str]) -> str:
    """The seed's four rules, written independently of the SQL aggregate they check."""
    if "processing" in children:
        return "processing"
    if "pending" in children:
        return "pending"
    if all(c == "completed" for c in children):
        return "completed"
    return "failed"


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.lists(st.lists(st.sampled_from(STATUSES), min_size=1, max_size=5), min_size=1, max_size=4))
def test_parent_always_equals_the_rule_of_its_children(queue, engine, pages):
    doc = build_document(queue, pages=len(pages), chunks_per_page=5, name=f"{uuid.uuid4().hex}.pdf")
    page_rows = queue.pages(doc["id"])
    with engine.begin() as conn:
        for page, child_statuses in zip(page_rows, pages):
            chunks = queue.chunks(page_id=page["id"])
            for chunk, status in zip(chunks, child_statuses):
                conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_status = %(s)s WHERE id = %(i)s",
                                     {"s": status, "i": str(chunk["id"])})
            # children beyond the drawn list are removed so the drawn list is the whole set
            for chunk in chunks[len(child_statuses):]:
                conn.exec_driver_sql("DELETE FROM task_queue_chunk WHERE id = %(i)s", {"i": str(chunk["id"])})
    queue.reconcile()
    page_rows = queue.pages(doc["id"])
    expected_pages = [seed_rule(children) for children in pages]
    assert [p["vector_status"] for p in page_rows] == expected_pages
    assert queue.document(str(doc["id"]))["vector_index_status"] == seed_rule(expected_pages)


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.lists(st.sampled_from(["complete", "fail", "hold"]), min_size=1, max_size=6))
def test_live_transitions_keep_parents_equal_to_the_rule(queue, outcomes):
    """Without reconcile: the incremental bubble-up alone keeps every parent right."""
    from queue_db.tasks import VECTOR_CHUNK

    doc = build_document(queue, pages=1, chunks_per_page=len(outcomes), name=f"{uuid.uuid4().hex}.pdf")
    worker = make_worker_id()
    tasks = queue.claim(VECTOR_CHUNK, worker, len(outcomes), only_ids=[c["id"] for c in queue.chunks(document_id=doc["id"])])
    for task, outcome in zip(sorted(tasks, key=lambda t: t["chunk_index"]), outcomes):
        if outcome == "complete":
            queue.complete(VECTOR_CHUNK, worker, [task["id"]])
        elif outcome == "fail":
            queue.fail(VECTOR_CHUNK, worker, [{"id": task["id"], "error": "x"}])
    children = [c["vector_status"] for c in queue.chunks(document_id=doc["id"])]
    page = queue.pages(doc["id"])[0]
    assert page["vector_status"] == seed_rule(children)
    assert queue.document(str(doc["id"]))["vector_index_status"] == seed_rule([page["vector_status"]])
