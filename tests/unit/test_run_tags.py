"""The range tag a person reads on a run: first and last key and how many partitions, in words."""

from orchestration.planning import PlannedRun, range_text


def test_a_range_reads_first_key_last_key_and_its_size():
    assert range_text("wild-1a2b", "wild-9f8e", 42, "document") == "wild-1a2b … wild-9f8e (42 documents)"
    assert range_text("wild-1a2b/p0001", "wild-1a2b/p0002", 2, "page") == "wild-1a2b/p0001 … wild-1a2b/p0002 (2 pages)"


def test_a_single_key_is_named_once():
    assert range_text("wild-1a2b", "wild-1a2b", 1, "document") == "wild-1a2b (1 document)"


def test_a_planned_run_keeps_the_span_the_planner_reads_beside_the_range():
    run = PlannedRun("ocr_page", "ocr", 3, 10, 12, "a/p0001", "a/p0003", 3, 0, "page")
    assert run.tags["docqueue/span"] == "3:10-12"
    assert run.tags["docqueue/range"] == "a/p0001 … a/p0003 (3 pages)"
