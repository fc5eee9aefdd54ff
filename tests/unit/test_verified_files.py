"""The record of files hashed before (resources/verified_files.py): an unchanged file is not read again, and any
change the file system can tell, even one that puts the old modification time back, has it hashed again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from resources.verified_files import verified_sha256


def counting_sha256(calls: list[Path]):
    def sha256(path: Path) -> str:
        calls.append(path)
        return hashlib.sha256(path.read_bytes()).hexdigest()

    return sha256


def test_an_unchanged_file_is_hashed_once(tmp_path):
    model, record, calls = tmp_path / "model.onnx", tmp_path / "verified.json", []
    model.write_bytes(b"weights" * 1000)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    for _ in range(3):
        assert verified_sha256(model, expected, record, counting_sha256(calls)) == expected
    assert calls == [model]
    # without a record, every call hashes
    assert verified_sha256(model, expected, None, counting_sha256(calls)) == expected
    assert len(calls) == 2


def test_a_file_rewritten_with_its_old_times_is_hashed_again(tmp_path):
    model, record, calls = tmp_path / "model.onnx", tmp_path / "verified.json", []
    model.write_bytes(b"a" * 4096)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    verified_sha256(model, expected, record, counting_sha256(calls))
    stat = model.stat()
    with open(model, "r+b") as handle:  # same inode, same size, the old modification time put back
        handle.write(b"b")
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert verified_sha256(model, expected, record, counting_sha256(calls)) != expected
    assert len(calls) == 2


def test_a_replaced_file_is_hashed_again_and_a_wrong_one_never_recorded(tmp_path):
    model, record, calls = tmp_path / "model.onnx", tmp_path / "verified.json", []
    model.write_bytes(b"a" * 4096)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    verified_sha256(model, expected, record, counting_sha256(calls))
    swapped = tmp_path / "other.onnx"
    swapped.write_bytes(b"c" * 4096)
    os.replace(swapped, model)
    for _ in range(2):
        assert verified_sha256(model, expected, record, counting_sha256(calls)) != expected
    assert len(calls) == 3


def test_a_record_that_cannot_be_read_or_written_is_ignored(tmp_path):
    model, calls = tmp_path / "model.onnx", []
    model.write_bytes(b"a" * 4096)
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    damaged = tmp_path / "verified.json"
    damaged.write_text("{not json", encoding="utf-8")
    assert verified_sha256(model, expected, damaged, counting_sha256(calls)) == expected
    assert verified_sha256(model, expected, damaged, counting_sha256(calls)) == expected  # rewritten whole
    assert len(calls) == 1
    unwritable = tmp_path / "missing-folder" / "verified.json"
    for _ in range(2):
        assert verified_sha256(model, expected, unwritable, counting_sha256(calls)) == expected
    assert len(calls) == 3
