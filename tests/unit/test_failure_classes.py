"""How a task's failure is classed: what the queue retries, and what a batch redoes one chunk at a time."""

from __future__ import annotations

import neo4j.exceptions

from orchestration.failures import SERVICE_ERROR_CLASSES, classify
from resources.llm_extraction import LlmCredentialsRefused, LlmError


def test_refused_credentials_fail_once_and_are_not_redone_chunk_by_chunk():
    for exc in (
        neo4j.exceptions.AuthError("{code: Neo.ClientError.Security.Unauthorized} {message: Authentication failed}"),
        neo4j.exceptions.TokenExpired("token expired"),
        LlmCredentialsRefused("LLM endpoint answered HTTP 401: bad key ***"),
        LlmCredentialsRefused("LLM endpoint answered HTTP 403: forbidden"),
    ):
        reason, error_class, retryable = classify(exc)
        assert (error_class, retryable) == ("auth", False), exc
        assert reason.startswith("auth: credentials refused") and type(exc).__name__ in reason
    assert "auth" in SERVICE_ERROR_CLASSES


def test_other_failures_keep_their_classes():
    assert classify(LlmError("LLM endpoint answered HTTP 400: bad request"))[1:] == ("internal", True)
    # the class says it, not the text: an error quoting a refusal is not one
    assert classify(LlmError("LLM endpoint answered HTTP 400: upstream said HTTP 401"))[1:] == ("internal", True)
    assert classify(LlmError("LLM endpoint failed after 3 attempts (HTTP 503)"))[1:] == ("internal", True)
    assert classify(ConnectionRefusedError("refused"))[1:] == ("connection", True)
    assert classify(neo4j.exceptions.ServiceUnavailable("down"))[1:] == ("connection", True)
    assert classify(ValueError("odd"))[1:] == ("internal", True)


def test_a_full_disk_is_one_retryable_sentence_naming_the_folder(tmp_path):
    import errno

    from resources.disk_space import DiskFull

    reason, error_class, retryable = classify(DiskFull(tmp_path / "storage"))
    assert (error_class, retryable) == ("disk_full", True)
    assert reason.startswith(f"disk full: no space left in {tmp_path / 'storage'}") and "\n" not in reason
    # a write outside the adapters: the folder of the file it was writing
    raw = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "home" / "page.md"))
    assert classify(raw)[:2] == (
        f"disk full: no space left in {tmp_path / 'home'}; the task is retried once space is freed",
        "disk_full",
    )
    # the embedded engine's error arrives as text
    assert classify(RuntimeError("Service internal error: No space left on device (os error 28)"))[1] == "disk_full"
    assert "disk_full" in SERVICE_ERROR_CLASSES  # a full disk is not one chunk's fault: the batch fails as a whole


def test_a_damaged_store_is_the_stores_failure_not_the_chunks():
    from resources.ports import GraphStoreDamaged, VectorStoreDamaged

    for exc in (VectorStoreDamaged("/home/q/main", "segment unreadable"), GraphStoreDamaged("/home/bolt/docqueue")):
        reason, error_class, retryable = classify(exc)
        assert (error_class, retryable) == ("damaged_store", True)
        assert reason == str(exc) and "repair" in reason
    assert "damaged_store" in SERVICE_ERROR_CLASSES
