"""A full disk under the two folders docqueue writes: the storage folder's page files and the embedded Qdrant store.
The write fails as one sentence naming the folder and leaves nothing half-written (the reliability test
tests/reliability/test_disk_full.py does the same on a real, filled file system)."""

from __future__ import annotations

import errno
import os
from collections import namedtuple

import pytest

from resources.disk_space import DiskFull
from resources.ports import ChunkPoint

DIM = 4


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_page_written_to_a_full_storage_folder_leaves_the_old_content_and_no_temp_file(tmp_path, monkeypatch):
    import resources.storage as storage_module
    from resources.storage import LocalStorage

    storage = LocalStorage(tmp_path / "storage")
    storage.put_text("doc/page_0001_nohf.md", "old page")
    monkeypatch.setattr(storage_module.os, "fsync", _enospc)  # the data reaches the disk at fsync
    with pytest.raises(DiskFull) as failure:
        storage.put_text("doc/page_0001_nohf.md", "new page")
    with pytest.raises(DiskFull):
        storage.put_text("doc/page_0002_nohf.md", "another page")
    assert str(failure.value) == f"disk full: no space left in {tmp_path / 'storage'}"
    assert sorted(os.listdir(tmp_path / "storage" / "doc")) == ["page_0001_nohf.md"]
    assert storage.get_text("doc/page_0001_nohf.md") == "old page"


def test_the_embedded_store_refuses_a_write_without_headroom_and_takes_it_once_space_is_freed(tmp_path, monkeypatch):
    import resources.folder_room as room
    from resources.qdrant_edge import EdgeVectorStore

    store = EdgeVectorStore(path=tmp_path / "qdrant", model_id="disk-full-test", dim=DIM, linger_s=0)
    point = ChunkPoint(chunk_id="doc:1:0", vector=[0.1, 0.2, 0.3, 0.4], payload={"document_id": "doc", "text": "a"})
    store.upsert([point])
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(room.shutil, "disk_usage", lambda path: usage(100 << 20, 99 << 20, 1 << 20))
    with pytest.raises(DiskFull) as failure:
        store.upsert([ChunkPoint(chunk_id="doc:1:1", vector=[0.4, 0.3, 0.2, 0.1], payload={"document_id": "doc"})])
    assert str(failure.value).startswith(f"disk full: no space left in {tmp_path / 'qdrant'} (1 MiB free")
    with pytest.raises(DiskFull):
        store.delete_document("doc")
    monkeypatch.undo()  # space freed
    assert store.count() == 1 and store.unindexed() == 1
    store.upsert([ChunkPoint(chunk_id="doc:1:1", vector=[0.4, 0.3, 0.2, 0.1], payload={"document_id": "doc"})])
    assert store.count() == 2
    store.close()


def test_the_cli_says_a_full_disk_in_one_sentence(tmp_path):
    from orchestration.cli.errors import known_failure

    failure = known_failure(DiskFull(tmp_path / "storage"))
    assert failure is not None and failure.message == f"disk full: no space left in {tmp_path / 'storage'}"
