"""The bubble-up rule, property-tested: for any set of children, and after any sequence of transitions through the
queue, the parent equals the seed's rule."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from queue_db.phases import KINDS_BY_NAME, VECTOR_PAGE
from queue_db.queue import make_worker_id
from tests.queue_support import build_document, chunk_all, expand, new_hash, ocr_all, register

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
                conn.exec_driver_sql(
                    "UPDATE task_queue_chunk SET vector_status = %(s)s WHERE id = %(i)s",
                    {"s": status, "i": str(chunk["id"])},
                )
            # children beyond the drawn list are removed so the drawn list is the whole set
            for chunk in chunks[len(child_statuses) :]:
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
    from queue_db.phases import VECTOR_CHUNK

    doc = build_document(queue, pages=1, chunks_per_page=len(outcomes), name=f"{uuid.uuid4().hex}.pdf")
    worker = make_worker_id()
    tasks = queue.claim(
        VECTOR_CHUNK, worker, len(outcomes), only_ids=[c["id"] for c in queue.chunks(document_id=doc["id"])]
    )
    for task, outcome in zip(sorted(tasks, key=lambda t: t["chunk_index"]), outcomes):
        if outcome == "complete":
            queue.complete(VECTOR_CHUNK, worker, [task["id"]])
        elif outcome == "fail":
            queue.fail(VECTOR_CHUNK, worker, [{"id": task["id"], "error": "x"}])
    children = [c["vector_status"] for c in queue.chunks(document_id=doc["id"])]
    page = queue.pages(doc["id"])[0]
    assert page["vector_status"] == seed_rule(children)
    assert queue.document(str(doc["id"]))["vector_index_status"] == seed_rule([page["vector_status"]])


# -- the bubble-up (queue_db.rollup_sql): random transitions through the queue, every parent checked after each one

TASK_KINDS = ["ocr_page", "vector_page", "vector_chunk", "graphrag_chunk"]
DOCUMENT_STATUS = {"ocr": "ocr_status", "vector": "vector_index_status", "graphrag": "graphrag_index_status"}

document_strategy = st.tuples(
    st.integers(1, 3),  # pages
    st.sampled_from(["expanded", "ocr", "chunked"]),  # how far the queue took it before the transitions
    st.integers(0, 3),  # chunks per page when it starts chunked
)


def _snapshot(engine, document_ids: list[str]) -> tuple[list[dict], list[dict], list[dict]]:
    """Documents, pages and chunks of `document_ids`, read in one transaction."""
    with engine.connect() as conn:

        def rows(sql: str) -> list[dict]:
            return [dict(r) for r in conn.exec_driver_sql(sql, {"ids": document_ids}).mappings().all()]

        documents = rows(
            "SELECT id::text, ocr_status::text, vector_index_status::text, graphrag_index_status::text "
            "FROM documents WHERE id = ANY(%(ids)s::uuid[])"
        )
        pages = rows(
            "SELECT id::text, document_id::text, chunked_at IS NOT NULL AS chunked, ocr_status::text, "
            "vector_status::text, graphrag_status::text FROM task_queue_page "
            "WHERE document_id = ANY(%(ids)s::uuid[])"
        )
        chunks = rows(
            "SELECT id::text, page_id::text, vector_status::text, graphrag_status::text "
            "FROM task_queue_chunk WHERE document_id = ANY(%(ids)s::uuid[])"
        )
    return documents, pages, chunks


def _parents_against_the_rule(engine, document_ids: list[str]) -> list[str]:
    """Every parent whose status is not the rule applied to its children, described; empty when all agree.
    Pages are parents in the vector and GraphRAG phases once chunked (before, their vector status is their own
    chunking task's); documents are parents of their pages in every phase."""
    documents, pages, chunks = _snapshot(engine, document_ids)
    wrong = []
    for page in (p for p in pages if p["chunked"]):
        children = [c for c in chunks if c["page_id"] == page["id"]]
        for phase in ("vector", "graphrag"):
            expected = seed_rule([c[f"{phase}_status"] for c in children])
            if page[f"{phase}_status"] != expected:
                wrong.append(
                    f"page {page['id']} {phase}: {page[f'{phase}_status']}, its {len(children)} chunks say {expected}"
                )
    for document in documents:
        children = [p for p in pages if p["document_id"] == document["id"]]
        for phase, column in DOCUMENT_STATUS.items():
            expected = seed_rule([p[f"{phase}_status"] for p in children])
            if document[column] != expected:
                wrong.append(
                    f"document {document['id']} {phase}: {document[column]}, its {len(children)} pages say {expected}"
                )
    return wrong


class BubbleAfterTransitions(RuleBasedStateMachine):
    """Two workers claim, complete and fail pages and chunks of every phase in any order through the queue (claim,
    complete, complete_chunking, fail, settle: every path that ends in the bubble-up); after each
    transaction every page and document equals the rule over its children, with no reconcile."""

    def __init__(self, queue, engine):
        super().__init__()
        self.queue, self.engine = queue, engine
        self.workers = [make_worker_id("left"), make_worker_id("right")]
        self.document_ids: list[str] = []
        self.held: dict[tuple[str, int], list[str]] = {}  # (kind, worker) -> ids it holds, oldest first

    @initialize(documents=st.lists(document_strategy, min_size=1, max_size=2))
    def create_documents(self, documents):
        for pages, stage, chunks_per_page in documents:
            doc = register(self.queue, f"{uuid.uuid4().hex}.pdf")
            expand(self.queue, doc, pages)
            if stage in ("ocr", "chunked"):
                ocr_all(self.queue, doc)
            if stage == "chunked":
                chunk_all(self.queue, doc, chunks_per_page)
            self.document_ids.append(str(doc["id"]))

    def _candidates(self, kind_name: str) -> list[str]:
        """This example's tasks of that kind: the database also holds the rows of earlier examples."""
        _, pages, chunks = _snapshot(self.engine, self.document_ids)
        return [r["id"] for r in (chunks if kind_name.endswith("_chunk") else pages)]

    def _holders(self) -> list[tuple[str, int]]:
        return sorted(key for key, ids in self.held.items() if ids)

    @rule(kind_name=st.sampled_from(TASK_KINDS), who=st.integers(0, 1), count=st.integers(1, 4))
    def claim(self, kind_name, who, count):
        claimed = self.queue.claim(
            KINDS_BY_NAME[kind_name], self.workers[who], count, only_ids=self._candidates(kind_name)
        )
        self.held.setdefault((kind_name, who), []).extend(t["id"] for t in claimed)

    def _take(self, data, count: int) -> tuple[str, int, list[str]]:
        """Up to `count` of the tasks one worker holds of one kind, oldest first: the ones it now settles."""
        kind_name, who = data.draw(st.sampled_from(self._holders()), label="holder")
        mine = self.held[(kind_name, who)]
        settled, mine[:] = mine[:count], mine[count:]
        return kind_name, who, settled

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), count=st.integers(1, 3), chunk_count=st.integers(0, 3))
    def complete(self, data, count, chunk_count):
        kind_name, who, settled = self._take(data, count)
        if kind_name == VECTOR_PAGE.name:
            for page_id in settled:  # a page's vector task completes by being cut into chunks
                assert self.queue.complete_chunking(
                    self.workers[who],
                    page_id,
                    [
                        {"chunk_index": i, "content_hash": new_hash(), "content": f"chunk {i}", "token_count": 2}
                        for i in range(chunk_count)
                    ],
                )
        else:
            assert self.queue.complete(KINDS_BY_NAME[kind_name], self.workers[who], settled).rejected == []

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), count=st.integers(1, 3), retryable=st.booleans())
    def fail(self, data, count, retryable):
        kind_name, who, settled = self._take(data, count)
        failures = [{"id": i, "error": "failed attempt", "retryable": retryable} for i in settled]
        assert self.queue.fail(KINDS_BY_NAME[kind_name], self.workers[who], failures).rejected == []

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), count=st.integers(1, 3), claim=st.integers(0, 3), retryable=st.booleans())
    def settle(self, data, count, claim, retryable):
        """What a worker loop sends between two batches, in one transaction: the first half of what it settles
        completes, the rest fails (a page's vector task completes only through chunking), and it claims more."""
        kind_name, who, settled = self._take(data, count)
        kind = KINDS_BY_NAME[kind_name]
        half = 0 if kind is VECTOR_PAGE else (len(settled) + 1) // 2
        failures = [{"id": i, "error": "failed attempt", "retryable": retryable} for i in settled[half:]]
        result = self.queue.settle(
            kind,
            self.workers[who],
            completed=None if kind is VECTOR_PAGE else settled[:half],
            failed=failures,
            claim=claim,
            only_ids=self._candidates(kind_name),
        )
        assert result.completed.rejected == [] and result.failed.rejected == []
        self.held[(kind_name, who)].extend(t["id"] for t in result.claimed)

    @invariant()
    def every_parent_follows_the_rule(self):
        wrong = _parents_against_the_rule(self.engine, self.document_ids) if self.document_ids else []
        assert not wrong, "parents out of line with their children:\n" + "\n".join(wrong)


def test_bubble_after_keeps_every_parent_equal_to_the_rule(queue, engine):
    run_state_machine_as_test(
        lambda: BubbleAfterTransitions(queue, engine),
        settings=hsettings(max_examples=25, stateful_step_count=25, deadline=None),
    )
