"""An S3-compatible bucket as an object source (resources.ports.ObjectSource): its objects under a prefix, listed
with a cap, and one object downloaded with a byte limit, pinned to the version that was listed.

Credentials come from boto3's usual sources (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN); they
are never logged and never part of an error message here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


class S3Unavailable(RuntimeError):
    """Listing or downloading failed for a reason retrying later may fix (network, throttling, permissions)."""


@dataclass(frozen=True)
class S3Object:
    key: str
    etag: str
    size: int
    last_modified: float  # epoch seconds


class S3Bucket:
    """Objects of `bucket` under `prefix`, through one boto3 client (made on first use unless given)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        timeout_s: float = 60.0,
        client=None,
    ):
        self.bucket, self.prefix, self.endpoint_url, self.region = bucket, prefix, endpoint_url, region
        self.timeout_s, self._client = timeout_s, client

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def address(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=self.timeout_s,
                read_timeout=self.timeout_s,
                retries={"max_attempts": 3, "mode": "standard"},
            )
            self._client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        return self._client

    def list_objects(self, max_listed: int) -> list[S3Object]:
        """Every object under the prefix; S3Unavailable past `max_listed` (refusing beats a partial view: objects
        past the cap would be silently missed) or when the listing fails."""
        from botocore.exceptions import BotoCoreError, ClientError

        objects: list[S3Object] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix, PaginationConfig={"PageSize": 1000}
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    objects.append(
                        S3Object(
                            item["Key"],
                            item.get("ETag", ""),
                            int(item.get("Size", 0)),
                            item["LastModified"].timestamp(),
                        )
                    )
                if len(objects) > max_listed:
                    raise S3Unavailable(
                        f"more than {max_listed} objects under {self.url}; narrow "
                        "DOCQUEUE_S3_PREFIX or raise DOCQUEUE_S3_MAX_LIST"
                    )
        except ClientError as exc:
            raise S3Unavailable(f"listing {self.url} failed: {_client_error(exc)}") from None
        except BotoCoreError as exc:
            raise S3Unavailable(f"listing {self.url} failed: {type(exc).__name__}") from None
        return objects

    def download(self, obj: S3Object, path: Path, limit: int) -> str:
        """ "ok", "gone" (changed or deleted since listed) or "too_large" (more than `limit` bytes). IfMatch pins
        the listed version: a key overwritten meanwhile is not downloaded under the old ETag."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=obj.key, IfMatch=obj.etag)
            body = response["Body"]
            size = 0
            try:
                with open(path, "wb") as handle:
                    while chunk := body.read(_CHUNK):
                        size += len(chunk)
                        if size > limit:
                            return "too_large"
                        handle.write(chunk)
            finally:
                body.close()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                return "gone"
            raise S3Unavailable(f"downloading {obj.key} failed: {_client_error(exc)}") from None
        except BotoCoreError as exc:
            raise S3Unavailable(f"downloading {obj.key} failed: {type(exc).__name__}") from None
        return "ok"


def _client_error(exc) -> str:
    error = exc.response.get("Error", {})
    return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip().rstrip(":")
