"""Intake from an S3-compatible object store: new objects under a prefix become documents.

Each object is downloaded (bounded by the maximum file size) to a temporary file and registered by the same
`ingest_file` as local files, with `source_path = s3://bucket/key`: the same bytes are one document wherever
they come from, and a changed object (same key, new content) is a new version of its document.

Which objects are new is decided by a cursor, not by downloading again. S3 lists in key order, not by time, so
every tick lists the prefix (bounded by `max_listed`) and takes the objects it has not handled yet, oldest first
by (LastModified, key), at most `max_objects` per tick. The cursor keeps the newest LastModified handled (the
watermark) and the (key, ETag) of every object handled within `lookback_s` before it. Keeping those, rather than
only "the newest key at the newest timestamp", makes the cursor correct when many objects share a timestamp
(a tick may stop half-way through them) and when an object appears late with an older LastModified (S3 stamps
an upload when it starts, so a long upload becomes visible after shorter, newer ones): anything up to
`lookback_s` older than the watermark is still caught.

Listing and downloading are the object source's (resources/s3_bucket.py, behind resources.ports.ObjectSource);
credentials stay there, never in a result or an error message.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable

from orchestration.intake import IngestResult, IntakeRules, ingest_file, too_large
from queue_db.config import default
from queue_db.queue import TaskQueue
from queue_db.service_config import IntakeConfig
from resources.ports import ObjectSource
from resources.s3_bucket import S3Bucket, S3Object, S3Unavailable  # noqa: F401 - S3Unavailable: callers catch it
from resources.storage import LocalStorage


class S3ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class S3Source:
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None  # None: AWS itself
    region: str | None = None
    max_objects: int = default(IntakeConfig, "s3_max_objects")  # downloaded and registered per tick
    max_listed: int = default(IntakeConfig, "s3_max_list")  # objects a tick may list under the prefix
    lookback_s: float = default(IntakeConfig, "s3_lookback_s")
    timeout_s: float = default(IntakeConfig, "s3_timeout_s")  # connect and read timeout of each request

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @classmethod
    def from_config(
        cls, intake: IntakeConfig, bucket: str | None = None, prefix: str | None = None
    ) -> "S3Source | None":
        """The configured source, or None when DOCQUEUE_S3_BUCKET is not set (and no bucket is given)."""
        env = intake
        bucket = (bucket if bucket is not None else env.s3_bucket).strip()
        if not bucket:
            return None
        return cls(
            bucket=bucket,
            prefix=(prefix if prefix is not None else env.s3_prefix).lstrip("/"),
            endpoint_url=env.s3_url or None,
            region=env.s3_region or None,
            max_objects=env.s3_max_objects,
            max_listed=env.s3_max_list,
            lookback_s=env.s3_lookback_s,
            timeout_s=env.s3_timeout_s,
        )

    @classmethod
    def from_url(cls, url: str, intake: IntakeConfig) -> "S3Source":
        """`s3://bucket/prefix`, with the endpoint and bounds of the intake settings (the region the AWS SDK's)."""
        if not url.startswith("s3://"):
            raise S3ConfigError(f"not an s3:// address: {url!r}")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise S3ConfigError(f"no bucket in {url!r}")
        source = cls.from_config(intake, bucket=bucket, prefix=prefix)
        assert source is not None
        return source

    def objects(self) -> ObjectSource:
        """The bucket's objects under the prefix, through its adapter."""
        return S3Bucket(
            self.bucket, self.prefix, endpoint_url=self.endpoint_url, region=self.region, timeout_s=self.timeout_s
        )


@dataclass
class IntakeCursor:
    watermark: float | None = None
    handled: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (ETag, LastModified)

    def to_json(self) -> str:
        return json.dumps(
            {"v": 1, "watermark": self.watermark, "handled": {k: [e, t] for k, (e, t) in sorted(self.handled.items())}},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | None) -> "IntakeCursor":
        """A cursor this code did not write (or none) starts from scratch: registering is idempotent, so the
        only cost is downloading objects once more."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            handled = {str(k): (str(v[0]), float(v[1])) for k, v in data.get("handled", {}).items()}
            watermark = data.get("watermark")
            return cls(None if watermark is None else float(watermark), handled)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError):
            return cls()

    def is_handled(self, obj: S3Object, lookback_s: float) -> bool:
        if self.watermark is not None and obj.last_modified < self.watermark - lookback_s:
            return True
        return self.handled.get(obj.key, (None,))[0] == obj.etag

    def mark(self, obj: S3Object) -> None:
        self.handled[obj.key] = (obj.etag, obj.last_modified)
        self.watermark = obj.last_modified if self.watermark is None else max(self.watermark, obj.last_modified)

    def prune(self, lookback_s: float, listed_keys: set[str] | None = None) -> None:
        """Forget what the watermark alone now covers, and objects that no longer exist."""
        if self.watermark is None:
            return
        floor = self.watermark - lookback_s
        self.handled = {
            k: v for k, v in self.handled.items() if v[1] >= floor and (listed_keys is None or k in listed_keys)
        }


@dataclass
class S3IntakeReport:
    source: str
    listed: int = 0
    results: list[IngestResult] = field(default_factory=list)
    remaining: int = 0  # new objects left for the next tick
    skipped: list[str] = field(default_factory=list)  # changed or deleted between listing and download
    error: str | None = None  # the tick stopped early: the rest waits for the next one
    cursor: IntakeCursor = field(default_factory=IntakeCursor)

    def counts(self) -> dict[str, int]:
        statuses = ("new", "new-version", "duplicate", "rejected")
        return {s: sum(1 for r in self.results if r.status == s) for s in statuses}

    def summary(self) -> str:
        counts = self.counts()
        text = (
            f"{self.source}: {self.listed} object(s) listed, {counts['new']} new, {counts['new-version']} new "
            f"version(s), {counts['duplicate']} duplicate, {counts['rejected']} rejected, "
            f"{self.remaining} left for the next tick"
        )
        if self.skipped:
            text += f", {len(self.skipped)} changed or deleted while reading"
        if self.error:
            text += f"; stopped early: {self.error}"
        return text


# ------------------------------------------------------------------------------------------------ selection
def pending_objects(objects: Iterable[S3Object], cursor: IntakeCursor, lookback_s: float) -> list[S3Object]:
    """Objects not handled yet, oldest first; ties on LastModified in key order, so a tick that stops inside
    a run of equal timestamps resumes exactly where it stopped."""
    fresh = [o for o in objects if not o.key.endswith("/") and not cursor.is_handled(o, lookback_s)]
    return sorted(fresh, key=lambda o: (o.last_modified, o.key))


# ------------------------------------------------------------------------------------------------ intake
def ingest_s3(
    queue: TaskQueue,
    storage: LocalStorage,
    source: S3Source,
    cursor: IntakeCursor | None = None,
    *,
    scratch: Path,
    objects: ObjectSource | None = None,
    priority: int = 0,
    rules: IntakeRules | None = None,
) -> S3IntakeReport:
    """One bounded pass: list, then download and register at most `source.max_objects` new objects. Returns
    the advanced cursor in the report (the caller stores it). Downloads go to temporary files under `scratch`
    (`<DOCQUEUE_HOME>/tmp`). A listing failure raises S3Unavailable; a
    download failure stops the pass there, with what was done kept in the cursor."""
    cursor = IntakeCursor(cursor.watermark, dict(cursor.handled)) if cursor else IntakeCursor()
    rules = rules or IntakeRules()
    bucket = objects or source.objects()
    listed = bucket.list_objects(source.max_listed)
    pending = pending_objects(listed, cursor, source.lookback_s)
    report = S3IntakeReport(source.url, listed=len(listed), cursor=cursor)
    done = 0
    for obj in pending[: source.max_objects]:
        try:
            result = _ingest_object(queue, storage, bucket, obj, priority=priority, rules=rules, scratch=scratch)
        except S3Unavailable as exc:
            report.error = str(exc)
            break
        done += 1
        if result is None:
            report.skipped.append(obj.key)
            continue
        report.results.append(result)
        cursor.mark(obj)
    report.remaining = len(pending) - done
    cursor.prune(source.lookback_s, {o.key for o in listed})
    return report


def ingest_s3_all(
    queue: TaskQueue,
    storage: LocalStorage,
    source: S3Source,
    *,
    scratch: Path,
    priority: int = 0,
    max_passes: int = 10_000,
    rules: IntakeRules | None = None,
) -> S3IntakeReport:
    """Everything under the prefix now, pass after pass (for the command line; sensors use one pass a tick)."""
    bucket = source.objects()
    total = S3IntakeReport(source.url)
    cursor = IntakeCursor()
    for _ in range(max_passes):
        report = ingest_s3(
            queue, storage, source, cursor, scratch=scratch, objects=bucket, priority=priority, rules=rules
        )
        cursor = report.cursor
        total.listed = report.listed
        total.results += report.results
        total.skipped += report.skipped
        total.remaining, total.error, total.cursor = report.remaining, report.error, cursor
        if report.error or not report.remaining:
            break
    return total


def _ingest_object(
    queue: TaskQueue,
    storage: LocalStorage,
    bucket: ObjectSource,
    obj: S3Object,
    *,
    priority: int,
    rules: IntakeRules,
    scratch: Path,
) -> IngestResult | None:
    """The object registered (or rejected), or None when it changed or vanished since it was listed (the next
    listing shows its new state)."""
    address = bucket.address(obj.key)
    if obj.size > rules.pdf.max_file_bytes:
        return IngestResult(address, "rejected", reason=too_large(rules.pdf.max_file_bytes))
    name = PurePosixPath(obj.key).name or "object"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="s3-", dir=scratch) as folder:
        path = Path(folder) / "object"
        outcome = bucket.download(obj, path, rules.pdf.max_file_bytes)
        if outcome == "gone":
            return None
        if outcome == "too_large":
            return IngestResult(address, "rejected", reason=too_large(rules.pdf.max_file_bytes))
        return ingest_file(
            queue,
            storage,
            path,
            priority=priority,
            rules=rules,
            source_path=address,
            name=name,
            metadata={"source": {"s3_etag": obj.etag, "s3_last_modified": obj.last_modified}},
        )
