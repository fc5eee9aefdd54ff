"""The embedded Bolt server's database folder read as files: whether it lost or cut one (fault-matrix row 7).

ArcadeDB does not refuse a damaged database folder; found on a scratch home, with the server stopped:
- a deleted bucket file: the type loses its bucket ("removing it from type configuration") and reads as empty, and
  the server writes that schema back, so after one start only the type without a bucket is left to see;
- schema.json cut or deleted: the previous schema (schema.prev.json) is loaded, without the types made since;
- a bucket file cut to nothing: counts still come from statistics.json, reads of its records fail;
- a deleted index file: the index is dropped from the schema, and with it the uniqueness that makes MERGE safe;
- a deleted edge-list file (`<vertex bucket>_out_edges`/`_in_edges`, made with every vertex bucket, named by no
  schema entry): the vertices' edges are skipped as "cannot load edge list chunk";
- a deleted dictionary file: the server does not start.
So the folder is checked before the server opens it: schema.json parses, every type has a bucket, every bucket and
index the schema names has its file, every vertex bucket its two edge-list files, no bucket file is unknown to the
schema, and a bucket file holds whole pages, at least as many as the database is known to have had.

What it had comes from two places. statistics.json is written when the database closes, never while it is open.
A server that was killed, not closed, leaves none; it leaves its write-ahead log instead (txlog_*.wal, deleted on a
clean close), which the next start replays. There a bucket of 0 bytes is ordinary (its pages may live only in the
log), and a page the file lacks is whole again after the replay when the log holds it from its first version (1).
A page the log holds from a later version only was on disk before: the replay stops at the version gap, and the
records of that page and of every later transaction are lost. So a bucket file is cut when a page below the
highest the log or statistics.json knows is neither on disk nor in the log from version 1, or when a vertex bucket
holds no page while one of its edge lists does (an edge list holds only the edges of the bucket's vertices).

The cost is a stat per file (a fixed set, whatever the corpus), reading the two JSON files and, after a kill, the
log's record headers (24 bytes per transaction and per page written, the page bytes skipped; ArcadeDB rotates a log
file at 64 MB and deletes the rotated one once its pages are on disk). Not found: a bucket cut (to a page boundary)
whose lost pages are all out of the log (none written since the last clean close or replay), when no
statistics.json says how many it had and it is not a vertex bucket cut to nothing while its edge lists hold pages:
an edge bucket or edge list cut so, or a vertex bucket cut to fewer pages but not to none.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NamedTuple

SCHEMA = "schema.json"
STATISTICS = "statistics.json"
EDGE_LISTS = ("_out_edges", "_in_edges")
# the log's records (com.arcadedb.engine.WALFile): a transaction is (id, time, pages, segment size), its pages,
# then (segment size, magic); a page is (file id, page number, delta from, delta to, page version, content size)
# and the delta's bytes
_TX_HEADER = struct.Struct(">qqii")
_PAGE_HEADER = struct.Struct(">iiiiii")
_TX_FOOTER = struct.Struct(">iq")
_WAL_MAGIC = 9371515385058702
_FIRST_VERSION = 1


class DataFile(NamedTuple):
    """A data file `<name>.<file id>.<page size>.v<version>.<kind>` and its size."""

    path: Path
    file_id: int
    page_size: int
    size: int


def database_folder(home: Path, database: str) -> Path:
    """Where the embedded server keeps `database` under its home."""
    return Path(home) / "databases" / database


def _data_file(path: Path) -> tuple[str, DataFile] | None:
    pieces = path.name.split(".")
    if len(pieces) != 5 or not pieces[1].isdigit() or not pieces[2].isdigit() or int(pieces[2]) <= 0:
        return None
    return pieces[0], DataFile(path, int(pieces[1]), int(pieces[2]), path.stat().st_size)


def folder_damage(folder: Path) -> str | None:
    """What is wrong with the database folder, as a clause naming the file; None when it looks whole (or does not
    exist yet: the server creates it)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    try:
        types = json.loads((folder / SCHEMA).read_text())["types"]
        if not isinstance(types, dict):
            raise ValueError("types is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {SCHEMA} is missing or unreadable: {type(exc).__name__}"
    if not any(folder.glob("dictionary.*.dict")):
        return "its dictionary file is missing"
    # the log before the files' sizes: a page reaches the disk before its log file is deleted, so a server that
    # flushes meanwhile cannot make a page look lost (the check is for a folder nothing writes to: the start runs it
    # with no server up, repair with no run going on)
    in_log = _pages_in_log(folder)
    files: dict[str, DataFile] = {}
    for path in folder.iterdir():
        found = _data_file(path)
        if found is not None:
            files[found[0]] = found[1]
    named: set[str] = set()
    vertex_buckets: list[str] = []
    for type_name, spec in sorted(types.items()):
        damage = _type_damage(type_name, spec, files, named)
        if damage is not None:
            return damage
        if spec.get("type") == "v":
            vertex_buckets += spec["buckets"]
    pages = _Pages(files, _pages_on_close(folder), in_log)
    return _files_damage(files, named, pages) or _edge_list_damage(vertex_buckets, files, pages)


def _type_damage(type_name: str, spec: dict, files: dict[str, DataFile], named: set[str]) -> str | None:
    """A type without a bucket, a bucket or index of it without its file, a uniqueness without its index; the
    buckets and indexes it names are added to `named`."""
    buckets = list(spec.get("buckets") or [])
    if not buckets:
        return f"the type {type_name} has no bucket left"
    indexes = spec.get("indexes") or {}
    named.update(buckets, indexes)
    for component in [*buckets, *sorted(indexes)]:
        if component not in files:
            return f"the file of {component} is missing"
    for constraint in _unique_constraints(spec):
        if not any(i.get("unique") and i.get("properties") == constraint for i in indexes.values()):
            return f"the type {type_name} has lost the unique index of {', '.join(constraint)}"
    return None


class _Pages:
    """How many pages each bucket is known to have had: on disk, in statistics.json, in the write-ahead log."""

    def __init__(self, files: dict[str, DataFile], on_close: dict[str, int], in_log: dict[int, dict[int, int]]):
        self.files, self.on_close, self.in_log = files, on_close, in_log

    def logged(self, name: str) -> dict[int, int]:
        """Page number -> the lowest version of it the log holds."""
        file = self.files.get(name)
        return self.in_log.get(file.file_id, {}) if file is not None else {}

    def known(self, name: str) -> int:
        file, logged = self.files.get(name), self.logged(name)
        on_disk = file.size // file.page_size if file is not None else 0
        return max(on_disk, self.on_close.get(name, 0), max(logged, default=-1) + 1)

    def lost(self, name: str) -> int | None:
        """The first page the bucket had that is neither on disk nor whole in the log; None when none is."""
        file, logged = self.files[name], self.logged(name)
        for page in range(file.size // file.page_size, self.known(name)):
            if logged.get(page) != _FIRST_VERSION:
                return page
        return None


def _files_damage(files: dict[str, DataFile], named: set[str], pages: _Pages) -> str | None:
    """A bucket statistics.json knows without its file, a bucket file cut short or unknown to the schema."""
    for name in sorted(pages.on_close.keys() - files.keys()):
        return f"the file of {name} is missing"
    for name, file in sorted(files.items()):
        if file.path.suffix != ".bucket":
            continue
        if file.size % file.page_size or pages.lost(name) is not None:
            return f"the bucket file {file.path.name} is cut short ({file.size} bytes)"
        if name not in named and not name.endswith(EDGE_LISTS):
            return f"the bucket file {file.path.name} is not in its {SCHEMA}"
    return None


def _edge_list_damage(vertex_buckets: list[str], files: dict[str, DataFile], pages: _Pages) -> str | None:
    """A vertex bucket without its edge-list files, or holding no page while an edge list of it holds some."""
    for bucket in sorted(vertex_buckets):
        for edge_list in (bucket + suffix for suffix in EDGE_LISTS):
            if edge_list not in files:
                return f"the file of {edge_list} is missing"
            if pages.known(bucket) == 0 and pages.known(edge_list) > 0:
                file = files[bucket]
                return f"the bucket file {file.path.name} is cut short ({file.size} bytes; {edge_list} holds pages)"
    return None


def _unique_constraints(spec: dict) -> list[list[str]]:
    """The properties of each uniqueness constraint the Cypher schema put on a type (kept in its custom map)."""
    found = []
    for key, value in sorted((spec.get("custom") or {}).items()):
        if key.startswith("cypher.constraint."):
            try:
                constraint = json.loads(value)
            except (TypeError, ValueError):
                continue
            if constraint.get("kind") == "UNIQUE":
                found.append(list(constraint.get("properties") or []))
    return found


def _pages_on_close(folder: Path) -> dict[str, int]:
    """Per bucket, how many pages it had when the database last closed (statistics.json; {} without one)."""
    try:
        stats = json.loads((folder / STATISTICS).read_text())
    except (OSError, ValueError):
        return {}
    held = {}
    for name, entry in stats.items() if isinstance(stats, dict) else ():
        ids = [page.get("id", 0) for page in (entry.get("pages") or [])] if isinstance(entry, dict) else []
        if ids:
            held[name] = max(ids) + 1
    return held


def _pages_in_log(folder: Path) -> dict[int, dict[int, int]]:
    """Per file id, per page, the lowest page version the write-ahead log holds ({} after a clean close, which
    deletes the log). A log is read as ArcadeDB's replay reads it: up to its first cut or invalid record."""
    held: dict[int, dict[int, int]] = {}
    for log in sorted(folder.glob("txlog_*.wal")):
        try:
            with open(log, "rb") as stream:
                size = log.stat().st_size
                position = 0
                while position + _TX_HEADER.size + _TX_FOOTER.size <= size:
                    position = _read_transaction(stream, position, size, held)
                    if position < 0:
                        break
        except (OSError, struct.error):  # unreadable, or shortened while read: what was read so far counts
            continue
    return held


def _read_transaction(stream, position: int, size: int, held: dict[int, dict[int, int]]) -> int:
    """Adds one logged transaction's pages to `held`; returns where the next begins, or -1 at a cut or invalid
    record (whose pages are then not added: the replay stops there too)."""
    stream.seek(position)
    _tx_id, _time, page_count, segment = _TX_HEADER.unpack(stream.read(_TX_HEADER.size))
    end = position + _TX_HEADER.size + segment
    if page_count < 0 or segment < 0 or end + _TX_FOOTER.size > size:
        return -1
    found = []
    cursor = position + _TX_HEADER.size
    for _ in range(page_count):
        if cursor + _PAGE_HEADER.size > end:
            return -1
        stream.seek(cursor)
        file_id, page, delta_from, delta_to, version, _content = _PAGE_HEADER.unpack(stream.read(_PAGE_HEADER.size))
        if delta_to < delta_from or delta_from < 0:
            return -1
        found.append((file_id, page, version))
        cursor += _PAGE_HEADER.size + delta_to - delta_from + 1
    stream.seek(end)
    if cursor != end or _TX_FOOTER.unpack(stream.read(_TX_FOOTER.size))[1] != _WAL_MAGIC:
        return -1
    for file_id, page, version in found:
        versions = held.setdefault(file_id, {})
        versions[page] = min(version, versions.get(page, version))
    return end + _TX_FOOTER.size
