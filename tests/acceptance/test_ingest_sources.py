"""`docqueue ingest -` (content from standard input) and `--idempotency-key`, run as subprocesses against real
services."""

from __future__ import annotations

import os
import subprocess

import pytest
import sqlalchemy as sa

from tests.acceptance.test_cli import COMMAND_TIMEOUT_S, DOCQUEUE, Result, queue_engine, refused, rows, succeeded

NOTE = "# Tide tables\n\nHigh water at Dover is at 10:42 tomorrow.\n\n- Neap tides this week\n- Spring tides next\n"


def ingest(*args: str, stdin: bytes | None = None, env: dict | None = None) -> Result:
    proc = subprocess.run(
        [DOCQUEUE, "ingest", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )
    return Result(("ingest", *args), proc.returncode, proc.stdout.decode(), proc.stderr.decode(), 0.0)


@pytest.fixture
def engine(docqueue_env):
    engine = queue_engine(docqueue_env.queue_url)
    yield engine
    engine.dispose()


def documents(engine: sa.Engine) -> list[dict]:
    return rows(
        engine,
        "SELECT filename, mime_type, source_path, idempotency_key, content_hash FROM documents ORDER BY created_at",
    )


def test_standard_input_is_one_document_under_the_given_name(docqueue_env, engine):
    first = succeeded(ingest("-", "--name", "tides.md", "--json", stdin=NOTE.encode())).json()
    assert [(r["path"], r["status"]) for r in first["results"]] == [("-:tides.md", "new")]
    again = succeeded(ingest("-", "--name", "copy.md", "--json", stdin=NOTE.encode())).json()
    assert again["results"][0]["status"] == "duplicate"
    assert again["results"][0]["document_id"] == first["results"][0]["document_id"]
    [document] = documents(engine)
    assert (document["filename"], document["mime_type"], document["source_path"]) == ("tides.md", "text/markdown", None)
    # another note under the same name is another document, not a new version of the first
    succeeded(ingest("-", "--name", "tides.md", stdin=b"Low water at Calais is at 16:05."))
    assert [d["mime_type"] for d in documents(engine)] == ["text/markdown", "text/plain"]
    assert not list((docqueue_env.home / "tmp").rglob("*")), "the copy of standard input is removed"


@pytest.mark.parametrize(
    "args, stdin, says",
    [
        (["-"], NOTE.encode(), "needs a file name: add --name"),
        (["-", "--name", "a.md", "other.txt"], NOTE.encode(), "cannot be combined with other paths"),
        (["--name", "a.md", "README.md"], NOTE.encode(), "--name names content from standard input only"),
        (["-", "--name", "../escape.md"], NOTE.encode(), "invalid name '../escape.md'"),
        (["-", "--name", "empty.md"], b"", "empty: zero-byte file"),
        (["-", "--name", "big.md"], b"x " * 2000, "too large: more than 0.002 MB (DOCQUEUE_MAX_FILE_MB)"),
        (["-", "--name", "program.md"], b"\x7fELF\x02\x01\x01" + bytes(200), "an executable program (ELF)"),
    ],
    ids=["no-name", "mixed-with-paths", "name-without-stdin", "name-with-a-path", "empty", "too-large", "binary"],
)
def test_bad_standard_input_is_one_sentence_and_nothing_is_written(docqueue_env, engine, args, stdin, says):
    message = refused(ingest(*args, stdin=stdin, env={"DOCQUEUE_MAX_FILE_MB": "0.002"}))
    assert says in message, message
    assert documents(engine) == []
    assert not (docqueue_env.home / "storage" / "documents").exists()
    assert not list((docqueue_env.home / "tmp").rglob("*"))


def test_an_idempotency_key_names_one_document_and_refuses_other_bytes(docqueue_env, engine, tmp_path):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("The ferry to Bergen leaves at nine.", encoding="utf-8")
    second.write_text("The ferry to Oslo leaves at ten.", encoding="utf-8")

    created = succeeded(ingest(str(first), "--idempotency-key", "upload-42", "--json")).json()["results"][0]
    assert created["status"] == "new"
    repeat = succeeded(ingest(str(first), "--idempotency-key", "upload-42", "--json")).json()["results"][0]
    assert (repeat["status"], repeat["document_id"]) == ("duplicate", created["document_id"])
    # the same key from standard input with the same bytes is the same document
    piped = succeeded(
        ingest("-", "--name", "again.txt", "--idempotency-key", "upload-42", "--json", stdin=first.read_bytes())
    ).json()["results"][0]
    assert (piped["status"], piped["document_id"]) == ("duplicate", created["document_id"])

    message = refused(ingest(str(second), "--idempotency-key", "upload-42"))
    assert message == (
        "docqueue: nothing was registered: idempotency key 'upload-42' was already used for "
        f"different content (document {created['document_key']})"
    )
    assert [(d["filename"], d["idempotency_key"]) for d in documents(engine)] == [("first.txt", "upload-42")]

    # content-hash deduplication stays: the second file without a key, then the same bytes under a new key
    plain = succeeded(ingest(str(second), "--json")).json()["results"][0]
    keyed = succeeded(ingest(str(second), "--idempotency-key", "upload-43", "--json")).json()["results"][0]
    assert (keyed["status"], keyed["document_id"]) == ("duplicate", plain["document_id"])
    assert [d["idempotency_key"] for d in documents(engine)] == ["upload-42", "upload-43"]


@pytest.mark.parametrize(
    "make_args, says",
    [
        (lambda folder: [str(folder), "--idempotency-key", "k"], "names one document, and the paths hold 2 files"),
        (lambda folder: [str(folder / "a.txt"), "--idempotency-key", "k" * 256], "at most 255 characters"),
    ],
    ids=["several-files", "too-long"],
)
def test_an_unusable_idempotency_key_is_one_sentence(docqueue_env, engine, tmp_path, make_args, says):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha", encoding="utf-8")
    (folder / "b.txt").write_text("beta", encoding="utf-8")
    message = refused(ingest(*make_args(folder)))
    assert says in message, message
    assert documents(engine) == []
