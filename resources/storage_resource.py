"""The storage folder as a Dagster resource (resources/storage.py holds the storage itself, free of Dagster, so
the CLI's intake opens it without importing Dagster)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from queue_db.config import Settings
from resources.storage import LocalStorage, storage_root


class StorageResource(dg.ConfigurableResource):
    """Where page markdown and other artefacts are kept; the entry point fills `root`
    (`StorageResource.from_settings`)."""

    root: str = Field(default="", description="Storage folder: DOCQUEUE_STORAGE_DIR or <DOCQUEUE_HOME>/storage.")

    @classmethod
    def from_settings(cls, settings: Settings) -> "StorageResource":
        return cls(root=str(storage_root(settings)))

    def get_storage(self) -> LocalStorage:
        if not self.root:
            raise ValueError("StorageResource has no root: build it with StorageResource.from_settings(settings)")
        return LocalStorage(Path(self.root).expanduser())
