"""Page storage on the local filesystem, addressed by relative POSIX keys.

Keys look like ``<document_key>/page_0003_nohf.md``. Every write goes to a temporary
file in the target folder and is renamed into place, so a worker killed mid-write
never leaves a half-written page behind: readers see the old content or the new one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from queue_db.config import Settings
from resources.disk_space import DiskFull, no_space

_TEMP_PREFIX = ".tmp-"
_COPY_CHUNK = 1024 * 1024


class InvalidKeyError(ValueError):
    """A storage key that could escape the storage root or is malformed."""


def page_file_key(document_key: str, page_number: int) -> str:
    """Key of the cleaned (no header/footer) markdown of a 1-based page."""
    if isinstance(page_number, bool) or not isinstance(page_number, int) or page_number < 1:
        raise ValueError(f"page_number must be a whole number >= 1, got {page_number!r}")
    _validate_key(document_key)
    return f"{document_key.strip('/')}/page_{page_number:04d}_nohf.md"


def _validate_key(key: str, *, allow_empty: bool = False) -> PurePosixPath:
    if not isinstance(key, str):
        raise InvalidKeyError(f"storage key must be a string, got {type(key).__name__}")
    if "\x00" in key:
        raise InvalidKeyError("storage key must not contain NUL bytes")
    if "\\" in key:
        # a backslash is a separator on Windows and a trap everywhere else
        raise InvalidKeyError(f"storage key must use '/' separators: {key!r}")
    if key.startswith("/") or (len(key) > 1 and key[1] == ":"):
        raise InvalidKeyError(f"storage key must be relative: {key!r}")
    stripped = key.strip("/")
    if not stripped:
        if allow_empty:
            return PurePosixPath(".")
        raise InvalidKeyError("storage key must not be empty")
    parts = stripped.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidKeyError(f"storage key has an empty, '.' or '..' segment: {key!r}")
        if part.startswith(_TEMP_PREFIX):
            raise InvalidKeyError(f"storage key segments must not start with {_TEMP_PREFIX!r}: {key!r}")
    return PurePosixPath(*parts)


class LocalStorage:
    """Files under one root folder; see the module docstring for the key rules."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self._real_root = Path(os.path.realpath(self.root))

    # -- path handling -------------------------------------------------
    def _path(self, key: str, *, allow_empty: bool = False) -> Path:
        relative = _validate_key(key, allow_empty=allow_empty)
        candidate = self._real_root / relative
        # realpath resolves symlinks in every existing component, so a link that
        # points outside the root is caught here, whether it is a folder or the file
        resolved = Path(os.path.realpath(candidate))
        if resolved != self._real_root and self._real_root not in resolved.parents:
            raise InvalidKeyError(f"storage key escapes the storage root: {key!r}")
        return candidate

    def _key_of(self, path: Path) -> str:
        return path.relative_to(self._real_root).as_posix()

    # -- writes ----------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        with self._room():
            target.parent.mkdir(parents=True, exist_ok=True)
            self._path(key)  # re-check: mkdir may have walked through a freshly planted link
            with self._atomic_writer(target) as handle:
                handle.write(data)

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def put_file(self, key: str, src_path: Path | str) -> None:
        target = self._path(key)
        with self._room():
            target.parent.mkdir(parents=True, exist_ok=True)
            self._path(key)
            with open(src_path, "rb") as source, self._atomic_writer(target) as handle:
                shutil.copyfileobj(source, handle, _COPY_CHUNK)

    @contextmanager
    def _room(self):
        """A full file system as one sentence naming the storage folder; the atomic writer has already removed
        its temporary file, so the key holds its old content or none."""
        try:
            yield
        except OSError as exc:
            if not no_space(exc):
                raise
            raise DiskFull(self.root) from None

    class _AtomicWriter:
        def __init__(self, target: Path):
            self.target = target
            fd, tmp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=target.parent)
            self.tmp_path = Path(tmp_name)
            self.handle = os.fdopen(fd, "wb")

        def __enter__(self):
            return self.handle

        def __exit__(self, exc_type, exc, tb):
            try:
                if exc_type is None:
                    self.handle.flush()
                    os.fsync(self.handle.fileno())
                self.handle.close()
                if exc_type is None:
                    os.replace(self.tmp_path, self.target)
                    _fsync_dir(self.target.parent)
            finally:
                if self.tmp_path.exists():
                    self.tmp_path.unlink()
            return False

    def _atomic_writer(self, target: Path) -> "LocalStorage._AtomicWriter":
        return LocalStorage._AtomicWriter(target)

    # -- reads -----------------------------------------------------------
    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no stored object under key {key!r}")
        return path.read_bytes()

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode("utf-8")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def local_path(self, key: str) -> Path:
        """Path of an existing stored file, for tools that need a real file."""
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no stored object under key {key!r}")
        return path

    # -- listing and deletion ------------------------------------------
    def list(self, prefix: str = "") -> list[str]:
        """Keys of the files inside folder `prefix` (recursively), or `prefix` itself if it is a file."""
        base = self._path(prefix, allow_empty=True)
        if base.is_file():
            return [self._key_of(base)]
        if not base.is_dir() or base.is_symlink():
            return []
        return sorted(self._key_of(path) for path in _walk_files(base))

    def delete_prefix(self, prefix: str) -> int:
        """Delete folder `prefix` (or the file of that key); returns how many files went."""
        if not prefix or not prefix.strip("/"):
            raise InvalidKeyError("refusing to delete the whole storage root; give a prefix")
        base = self._path(prefix)
        if base.is_symlink() or base.is_file():
            base.unlink()
            return 1
        if not base.is_dir():
            return 0
        removed = 0
        for path in _walk_files(base, everything=True):
            path.unlink()
            removed += 0 if path.name.startswith(_TEMP_PREFIX) else 1
        shutil.rmtree(base, ignore_errors=True)
        return removed


def _walk_files(base: Path, everything: bool = False):
    """Stored files under `base`; `everything` adds temp files and symlinks (for deletion)."""
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        # os.walk lists a symlinked folder under dirnames without entering it
        links = [name for name in dirnames if (Path(dirpath) / name).is_symlink()]
        for name in sorted(filenames) + (sorted(links) if everything else []):
            path = Path(dirpath) / name
            if not everything and (name.startswith(_TEMP_PREFIX) or path.is_symlink()):
                # a link is not content we wrote; listing it could leak outside files
                continue
            yield path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support fsync on directories
    finally:
        os.close(fd)


def storage_root(settings: Settings) -> Path:
    """The storage folder: DOCQUEUE_STORAGE_DIR, else `<DOCQUEUE_HOME>/storage`."""
    configured = settings.storage.storage_dir
    if configured:
        return Path(configured).expanduser()
    return Path(settings.database.home).expanduser().resolve() / "storage"
