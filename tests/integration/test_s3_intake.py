"""Intake from an S3-compatible object store, against a real S3 server (moto in server mode on 127.0.0.1): the
sensor registers each object once, a changed object becomes a new version, the same bytes under another key are
the same document, unsupported objects are rejected with their reason, and ticks are bounded."""

from __future__ import annotations

import re
import uuid

import dagster as dg
import pytest

from tests import pdf_factory as pf

SECRET = "s3cr3t-never-shown-9f2c"


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    """A fresh bucket, with the credentials and endpoint in the environment the way an operator sets them."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "docqueue-test",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "DOCQUEUE_S3_URL": s3_endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    name = f"docqueue-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    monkeypatch.setenv("DOCQUEUE_S3_BUCKET", name)
    monkeypatch.setenv("DOCQUEUE_S3_PREFIX", "inbox/")
    return name, client


def _put(client, bucket: str, key: str, body: bytes) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body)


def _counts(message: str) -> list[int]:
    found = re.search(r"(\d+) new, (\d+) new version\(s\), (\d+) duplicate, (\d+) rejected", message)
    assert found, message
    return [int(n) for n in found.groups()]


def _tick(defs, instance, cursor: str | None):
    from orchestration.definitions import build_resources
    from queue_db.config import Settings

    sensor = defs.resolve_sensor_def("s3_intake_sensor")
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=sensor.name,
        resources=build_resources(Settings.from_env()),
        cursor=cursor,
    ) as context:
        return sensor.evaluate_tick(context)


def test_sensor_registers_objects_once_and_a_changed_object_as_a_new_version(
    docqueue_env, bucket, tmp_path, monkeypatch
):
    from orchestration.code_location import build_definitions
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    name, client = bucket
    monkeypatch.setenv("DOCQUEUE_S3_MAX_OBJECTS", "2")
    defs = build_definitions(Settings.from_env())  # the code location as it loads with this environment
    report = pf.text_pdf(tmp_path, "report.pdf", [["# Harbour Report", "Seven ships returned before the storm."]])
    _put(client, name, "inbox/report.pdf", report.read_bytes())
    _put(client, name, "inbox/zz-copy.pdf", report.read_bytes())  # the same bytes under another key
    _put(client, name, "inbox/notes.md", b"# Notes\n\nThe survey team measured soil moisture.\n")
    _put(client, name, "inbox/tool.pdf", b"\x7fELF\x02\x01\x01\x00" + bytes(200))
    _put(client, name, "inbox/folder/", b"")  # a console-made "folder": not a document
    _put(client, name, "elsewhere/other.pdf", report.read_bytes())  # outside the prefix

    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    try:
        first = _tick(defs, instance, None)
        assert "5 object(s) listed" in first.skip_message and "2 left for the next tick" in first.skip_message
        second = _tick(defs, instance, first.cursor)
        assert "0 left for the next tick" in second.skip_message
        totals = [a + b for a, b in zip(_counts(first.skip_message), _counts(second.skip_message))]
        assert totals == [2, 0, 1, 1], (first.skip_message, second.skip_message)  # new, version, dup, rejected
        third = _tick(defs, instance, second.cursor)
        assert "0 new, 0 new version(s), 0 duplicate, 0 rejected, 0 left" in third.skip_message
        assert SECRET not in first.skip_message + second.skip_message + third.skip_message

        with queue.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT source_path, mime_type, filename FROM documents ORDER BY source_path"
            ).all()
        assert [tuple(r) for r in rows] == [
            (f"s3://{name}/inbox/notes.md", "text/markdown", "notes.md"),
            (f"s3://{name}/inbox/report.pdf", "application/pdf", "report.pdf"),
        ]
        assert len(instance.get_dynamic_partitions("documents")) == 2

        changed = pf.text_pdf(tmp_path, "report-v2.pdf", [["# Harbour Report", "Nine ships returned this time."]])
        _put(client, name, "inbox/report.pdf", changed.read_bytes())
        fourth = _tick(defs, instance, third.cursor)
        assert "0 new, 1 new version(s)" in fourth.skip_message, fourth.skip_message
        with queue.engine.connect() as conn:
            versions = conn.exec_driver_sql(
                "SELECT id, supersedes FROM documents WHERE source_path = %(p)s ORDER BY created_at",
                {"p": f"s3://{name}/inbox/report.pdf"},
            ).all()
        assert len(versions) == 2 and versions[1][1] == versions[0][0] and versions[0][1] is None
        assert "0 new, 0 new version(s)" in _tick(defs, instance, fourth.cursor).skip_message

        monkeypatch.delenv("DOCQUEUE_S3_BUCKET")
        defs = build_definitions(Settings.from_env())
        assert _tick(defs, instance, fourth.cursor).skip_message == "DOCQUEUE_S3_BUCKET is not set"
    finally:
        instance.dispose()


def test_rejections_bounds_and_failures_say_why_without_credentials(queue, bucket, tmp_path, monkeypatch):
    from orchestration.intake import IntakeRules
    from orchestration.s3_intake import IntakeCursor, S3Object, S3Source, S3Unavailable, _ingest_object, ingest_s3
    from queue_db.config import Settings
    from resources.ocr import PdfLimits
    from resources.storage import LocalStorage

    name, client = bucket
    scratch = tmp_path / "home" / "tmp"
    storage = LocalStorage(tmp_path / "store")
    _put(client, name, "inbox/archive.pdf", b"PK\x05\x06" + bytes(18))  # an empty ZIP named .pdf
    _put(client, name, "inbox/big.txt", b"word " * 4000)  # 20 KB
    _put(client, name, "inbox/empty.txt", b"")
    source = S3Source.from_config(Settings.from_env().intake)
    assert source is not None and source.url == f"s3://{name}/inbox/"

    rules = IntakeRules(pdf=PdfLimits(max_file_bytes=10_000))
    report = ingest_s3(queue, storage, source, None, scratch=scratch, rules=rules)
    reasons = {r.path.rsplit("/", 1)[1]: r.reason for r in report.results}
    assert reasons == {
        "archive.pdf": "unsupported: a ZIP archive that is not a document (EPUB, XPS, DOCX or XLSX) "
        "(detected: application/zip)",
        "big.txt": "too large: more than 0.00954 MB (DOCQUEUE_MAX_FILE_MB)",
        "empty.txt": "empty: zero-byte file",
    }
    assert {r.status for r in report.results} == {"rejected"} and report.remaining == 0
    # a rejected object is remembered: not downloaded again on the next pass
    assert ingest_s3(queue, storage, source, report.cursor, scratch=scratch, rules=rules).results == []
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM documents").scalar() == 0

    # overwritten between listing and download: the listed version is not registered under the old ETag
    _put(client, name, "inbox/moving.txt", b"first words of a note")
    listed = client.head_object(Bucket=name, Key="inbox/moving.txt")
    stale = S3Object("inbox/moving.txt", listed["ETag"], listed["ContentLength"], listed["LastModified"].timestamp())
    _put(client, name, "inbox/moving.txt", b"second words of a note")
    assert (
        _ingest_object(queue, storage, source.objects(), stale, priority=0, rules=IntakeRules(), scratch=scratch)
        is None
    )

    missing = S3Source(bucket=f"missing-{uuid.uuid4().hex[:8]}", endpoint_url=source.endpoint_url)
    with pytest.raises(S3Unavailable) as failure:
        ingest_s3(queue, storage, missing, IntakeCursor(), scratch=scratch)
    assert "NoSuchBucket" in str(failure.value) and SECRET not in str(failure.value)
