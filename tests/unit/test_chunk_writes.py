"""How a batch of chunked pages is written (orchestration.task_outcomes.write_chunked_pages), with the queue replaced
by a scripted one: one transaction for the batch; when it fails for a reason that may lie in one page, each page
alone, so that page fails by itself; when a service is down, every page fails at once without a page-by-page retry."""

from __future__ import annotations

from orchestration.task_outcomes import Outcome, write_chunked_pages


class Queue:
    """complete_chunkings as the queue has it; a write of one page is the page-by-page retry."""

    def __init__(self, batch_error: Exception | None = None, bad_page: str | None = None, lost: set[str] = frozenset()):
        self.batch_error, self.bad_page, self.lost = batch_error, bad_page, set(lost)
        self.calls: list[tuple[str, list[str]]] = []

    def complete_chunkings(self, worker_id, pages):
        alone = len(pages) == 1
        self.calls.append(("page" if alone else "batch", sorted(pages)))
        if not alone and self.batch_error is not None:
            raise self.batch_error
        if alone and self.bad_page in pages:
            raise ValueError("this page's rows are refused")
        return {page for page in pages if page not in self.lost}


PAGES = {"p1": [{"chunk_index": 0}], "p2": [{"chunk_index": 0}], "p3": []}


def test_a_batch_is_one_write_and_a_page_taken_over_is_refused_alone():
    queue = Queue(lost={"p2"})
    written = write_chunked_pages(queue, "w", PAGES)
    assert {page: (o.ok, o.rejected) for page, o in written.items()} == {
        "p1": (True, False),
        "p2": (True, True),
        "p3": (True, False),
    }
    assert queue.calls == [("batch", ["p1", "p2", "p3"])]


def test_a_failing_batch_is_written_page_by_page_and_only_the_bad_page_fails():
    queue = Queue(batch_error=ValueError("one page's rows are refused"), bad_page="p2")
    written = write_chunked_pages(queue, "w", PAGES)
    assert (written["p1"].ok, written["p1"].rejected) == (True, False)
    assert (written["p3"].ok, written["p3"].rejected) == (True, False)
    assert isinstance(written["p2"], Outcome) and not written["p2"].ok and "refused" in written["p2"].error
    assert [kind for kind, _ in queue.calls] == ["batch", "page", "page", "page"]


def test_a_service_down_fails_every_page_without_a_page_by_page_retry():
    queue = Queue(batch_error=ConnectionRefusedError("the queue database is down"))
    written = write_chunked_pages(queue, "w", PAGES)
    assert all(isinstance(o, Outcome) and o.error_class == "connection" and o.retryable for o in written.values())
    assert queue.calls == [("batch", ["p1", "p2", "p3"])]
