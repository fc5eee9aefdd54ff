"""LocalStorage on the real filesystem: key rules, atomic writes, listing and deletion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from queue_db.config import Settings
from resources.storage import InvalidKeyError, LocalStorage, page_file_key
from resources.storage_resource import StorageResource

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "store")


def test_bytes_text_and_file_round_trip(storage: LocalStorage, tmp_path: Path):
    storage.put_bytes("doc-a/raw.bin", b"\x00\x01binary")
    storage.put_text("doc-a/page_0001_nohf.md", "# Títle\n\nbody ✓\n")
    source = tmp_path / "source.pdf"
    source.write_bytes(b"%PDF-1.7 fake" * 1000)
    storage.put_file("doc-a/original.pdf", source)

    assert storage.get_bytes("doc-a/raw.bin") == b"\x00\x01binary"
    assert storage.get_text("doc-a/page_0001_nohf.md") == "# Títle\n\nbody ✓\n"
    assert storage.local_path("doc-a/original.pdf").read_bytes() == source.read_bytes()
    assert storage.exists("doc-a/raw.bin") and not storage.exists("doc-a/missing.md")


def test_overwrite_replaces_content(storage: LocalStorage):
    storage.put_text("d/p.md", "first version that is long")
    storage.put_text("d/p.md", "second")
    assert storage.get_text("d/p.md") == "second"


def test_missing_key_raises_file_not_found(storage: LocalStorage):
    with pytest.raises(FileNotFoundError):
        storage.get_bytes("nope/page.md")
    with pytest.raises(FileNotFoundError):
        storage.local_path("nope/page.md")


@pytest.mark.parametrize(
    "key",
    [
        "/etc/passwd",
        "../outside.md",
        "doc/../../outside.md",
        "doc/./p.md",
        "doc//p.md",
        "a\x00b",
        "doc\\p.md",
        "",
        "/",
        "C:/windows/x",
        "doc/.tmp-sneaky",
    ],
)
def test_rejects_dangerous_keys(storage: LocalStorage, key: str):
    with pytest.raises(InvalidKeyError):
        storage.put_text(key, "x")
    with pytest.raises(InvalidKeyError):
        storage.exists(key)


def test_rejects_symlink_escapes(storage: LocalStorage, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not read")
    os.symlink(outside, storage.root / "linkdir")
    os.symlink(outside / "secret.txt", storage.root / "linkfile.txt")

    for key in ("linkdir/secret.txt", "linkdir/new.md", "linkfile.txt"):
        with pytest.raises(InvalidKeyError):
            storage.get_bytes(key)
        with pytest.raises(InvalidKeyError):
            storage.put_text(key, "overwrite attempt")
    assert (outside / "secret.txt").read_text() == "do not read"
    assert not (outside / "new.md").exists()
    assert storage.list("") == []  # links are not listed as stored content


def test_list_and_delete_prefix_work_on_folders(storage: LocalStorage):
    for key in ("doc1/page_0001_nohf.md", "doc1/page_0002_nohf.md", "doc1/sub/x.md", "doc10/page_0001_nohf.md"):
        storage.put_text(key, key)

    assert storage.list("doc1") == ["doc1/page_0001_nohf.md", "doc1/page_0002_nohf.md", "doc1/sub/x.md"]
    assert storage.list("doc1/") == storage.list("doc1")
    assert storage.list("doc1/page_0002_nohf.md") == ["doc1/page_0002_nohf.md"]
    assert storage.list("absent") == []
    assert len(storage.list("")) == 4

    assert storage.delete_prefix("doc1") == 3
    assert storage.list("") == ["doc10/page_0001_nohf.md"]  # doc10 is not under doc1
    assert storage.delete_prefix("doc1") == 0
    with pytest.raises(InvalidKeyError):
        storage.delete_prefix("")


def test_delete_prefix_removes_a_link_not_its_target(storage: LocalStorage, tmp_path: Path):
    outside = tmp_path / "keep"
    outside.mkdir()
    (outside / "file.txt").write_text("keep me")
    storage.put_text("doc/page.md", "x")
    os.symlink(outside, storage.root / "doc" / "link")
    assert storage.delete_prefix("doc") == 2
    assert (outside / "file.txt").read_text() == "keep me"


def test_page_file_key_format():
    assert page_file_key("batch-7/doc-42", 3) == "batch-7/doc-42/page_0003_nohf.md"
    assert page_file_key("doc", 12345) == "doc/page_12345_nohf.md"
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError):
            page_file_key("doc", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        page_file_key("../doc", 1)


def test_readers_never_see_a_half_written_page(storage: LocalStorage):
    big_a, big_b = b"A" * 3_000_000, b"B" * 2_000_000
    storage.put_bytes("doc/page.md", big_a)
    stop = threading.Event()
    torn = []

    def writer():
        while not stop.is_set():
            storage.put_bytes("doc/page.md", big_b)
            storage.put_bytes("doc/page.md", big_a)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 1.5
        reads = 0
        while time.monotonic() < deadline:
            data = storage.get_bytes("doc/page.md")
            reads += 1
            if data not in (big_a, big_b):
                torn.append(len(data))
    finally:
        stop.set()
        thread.join()
    assert reads > 5 and torn == []


def test_killed_writer_leaves_old_or_new_content(tmp_path: Path):
    root = tmp_path / "store"
    script = (
        "import sys; from resources.storage import LocalStorage\n"
        "s = LocalStorage(sys.argv[1]); s.put_bytes('doc/page.md', b'old')\n"
        "print('ready', flush=True)\n"
        "while True: s.put_bytes('doc/page.md', b'N' * 50_000_000)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(root)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(0.7)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    storage = LocalStorage(root)
    data = storage.get_bytes("doc/page.md")
    assert data == b"old" or data == b"N" * 50_000_000
    assert storage.list("doc") == ["doc/page.md"]  # a leftover temp file is never listed


def test_storage_resource_default_root(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("DOCQUEUE_STORAGE_DIR", str(tmp_path / "from-env"))
    assert StorageResource.from_settings(Settings.from_env()).get_storage().root == tmp_path / "from-env"

    monkeypatch.delenv("DOCQUEUE_STORAGE_DIR")
    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    assert StorageResource.from_settings(settings).get_storage().root == (tmp_path / "home").resolve() / "storage"

    explicit = StorageResource(root=str(tmp_path / "explicit")).get_storage()
    explicit.put_text("k/v.md", "x")
    assert (tmp_path / "explicit" / "k" / "v.md").read_text() == "x"
