"""Reading a shard's files into the page cache beside its loading (resources/page_cache.py): the file ends up in the
cache whole, by sendfile or, where the kernel cannot send to /dev/null, in blocks, and a file that cannot be read
is left alone."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from resources import page_cache

SIZE = 6 * page_cache.BLOCK_BYTES + 12345


def evicted(path: Path) -> Path:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


def cached_bytes(path: Path) -> int:
    """The bytes of `path` the kernel holds (util-linux's fincore)."""
    shown = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True)
    return int(shown.stdout.split()[0])


@pytest.fixture
def data_file(tmp_path):
    if shutil.which("fincore") is None:
        pytest.skip("needs util-linux's fincore to see the page cache")
    path = tmp_path / "quantized.data"
    path.write_bytes(os.urandom(SIZE))
    if cached_bytes(evicted(path)) > SIZE // 2:
        pytest.skip("this file system keeps the file cached whatever it is told")
    return path


def test_a_file_is_read_into_the_cache_whole(data_file):
    page_cache.read_into_cache(data_file)
    assert cached_bytes(data_file) >= SIZE - 4096


def test_where_sendfile_cannot_write_to_dev_null_the_file_is_read_in_blocks(data_file, monkeypatch):
    send = os.sendfile

    def partial_then_refused(out_fd, in_fd, offset, count):
        if offset:
            raise OSError(errno.EINVAL, "Invalid argument")
        return send(out_fd, in_fd, offset, page_cache.BLOCK_BYTES)

    monkeypatch.setattr(os, "sendfile", partial_then_refused)
    page_cache.read_into_cache(data_file)
    assert cached_bytes(data_file) >= SIZE - 4096


def test_a_file_that_cannot_be_read_is_skipped(data_file, tmp_path):
    thread = page_cache.reading([tmp_path / "replaced-meanwhile.data", data_file])
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert cached_bytes(data_file) >= SIZE - 4096
