"""The phase specs: the registry's order and lookups, the enum-like access callers use, and the retry policy."""

from __future__ import annotations

import pytest

from queue_db.phases import (
    ALL_KINDS,
    GRAPHRAG_CHUNK,
    OCR_DOCUMENT,
    PHASES,
    VECTOR_CHUNK,
    VECTOR_PAGE,
    Level,
    Phase,
    PhaseRegistry,
    PhaseSpec,
    kinds_of_phase,
    leaf_kind,
)
from queue_db.retry_policy import RetryPolicy
from queue_db.rollup_sql import after_transition, bubble_function, bubble_statements


def test_the_default_registry_is_ocr_vector_graphrag():
    assert [p.name for p in PHASES] == ["ocr", "vector", "graphrag"]
    assert list(Phase) == list(PHASES) and Phase("vector") is Phase.VECTOR is PHASES.phase("vector")
    assert ALL_KINDS == PHASES.kinds and kinds_of_phase(Phase.VECTOR) == (VECTOR_PAGE, VECTOR_CHUNK)
    assert leaf_kind(Phase.OCR).level is Level.PAGE and GRAPHRAG_CHUNK.phase is Phase.GRAPHRAG
    assert PHASES.previous(Phase.OCR) is None and Phase.GRAPHRAG.previous is Phase.VECTOR
    assert Phase.VECTOR.rollup_column(Level.DOCUMENT, "status") == "vector_index_status"
    assert Phase.VECTOR.rollup_column(Level.PAGE, "status") == "vector_status"
    assert (Phase.OCR.pool, Phase.OCR.celery_queue, Phase.OCR.handler) == ("ocr", "ocr", "ocr")
    with pytest.raises(ValueError, match="unknown phase"):
        Phase("summary")


def test_names_are_unique_in_a_registry():
    with pytest.raises(ValueError, match="unique"):
        PhaseRegistry((*PHASES.phases, Phase.OCR))


def test_the_back_off_doubles_up_to_its_cap_and_jitter_only_shortens_it():
    policy = RetryPolicy(base_s=10, cap_s=600, attempts=3)
    assert [policy.delay_seconds(n) for n in range(8)] == [10, 20, 40, 80, 160, 320, 600, 600]
    jittered = RetryPolicy(base_s=10, cap_s=600, jitter=0.5)
    assert jittered.delay_seconds(1, draw=0.0) == 20
    assert jittered.delay_seconds(1, draw=0.999) == pytest.approx(10, 0.01)
    assert "random()" in jittered.delay_sql("r") and "random()" not in policy.delay_sql("r")
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)


def test_the_queue_default_policy_comes_from_settings_and_a_kind_may_have_its_own():
    registry = PHASES.with_default_retry(RetryPolicy.from_settings(3, 10.0, 600.0))
    assert registry.retry_policy(VECTOR_CHUNK) == RetryPolicy(10.0, 600.0, 3, 0.0)
    assert VECTOR_CHUNK.max_retries_sql("t") == "t.max_retries"


def test_a_document_task_has_no_bubble_up_and_a_chunk_task_rolls_up_pages_then_documents():
    assert after_transition(OCR_DOCUMENT) == () and bubble_function(OCR_DOCUMENT) is None
    statements = bubble_statements(VECTOR_CHUNK)
    assert "force_generic_plan" in statements[0]
    assert "task_queue_page p, settled, claimed" in statements[1] and "FROM documents p" in statements[3]
    # the hot path sends one call of the generated function whose body runs those statements
    name, create = bubble_function(VECTOR_CHUNK)
    assert after_transition(VECTOR_CHUNK) == (f"SELECT {name}(%(worker)s, %(ids)s::uuid[])",)
    assert all(
        statement.strip().replace("%(ids)s", "p_ids").replace("%(worker)s", "p_worker") in create
        for statement in statements
    )
    assert isinstance(Phase.OCR, PhaseSpec)
