"""The embedded Bolt server's database folder read as files: whether it lost or cut one (fault-matrix row 7).

ArcadeDB does not refuse a damaged database folder; found on a scratch home, with the server stopped:
- a deleted bucket file: the type loses its bucket ("removing it from type configuration") and reads as empty, and
  the server writes that schema back, so after one start only the type without a bucket is left to see;
- schema.json cut or deleted: the previous schema (schema.prev.json) is loaded, without the types made since;
- a bucket file cut to nothing: counts still come from statistics.json, reads of its records fail;
- a deleted index file: the index is dropped from the schema, and with it the uniqueness that makes MERGE safe;
- a deleted dictionary file: the server does not start.
So the folder is checked before the server opens it: schema.json parses, every type has a bucket, every bucket and
index the schema names has its file, no bucket file is unknown to the schema, and a bucket file holds whole pages,
at least as many as statistics.json (written when the database closes, never while it is open) says it had. The
cost is a stat per file (a fixed set, whatever the corpus) and reading the two JSON files.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "schema.json"
STATISTICS = "statistics.json"


def database_folder(home: Path, database: str) -> Path:
    """Where the embedded server keeps `database` under its home."""
    return Path(home) / "databases" / database


def _parts(path: Path) -> tuple[str, int] | None:
    """(component name, page size) of a data file `<name>.<file id>.<page size>.v<version>.<kind>`."""
    pieces = path.name.split(".")
    if len(pieces) != 5 or not pieces[2].isdigit():
        return None
    return pieces[0], int(pieces[2])


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
    files: dict[str, tuple[Path, int]] = {}
    for path in folder.iterdir():
        parts = _parts(path)
        if parts is not None:
            files[parts[0]] = (path, parts[1])
    named: set[str] = set()
    for type_name, spec in sorted(types.items()):
        damage = _type_damage(type_name, spec, files, named)
        if damage is not None:
            return damage
    return _files_damage(files, named, _pages_on_close(folder))


def _type_damage(type_name: str, spec: dict, files: dict[str, tuple[Path, int]], named: set[str]) -> str | None:
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


def _files_damage(files: dict[str, tuple[Path, int]], named: set[str], pages: dict[str, int]) -> str | None:
    """A bucket statistics.json knows without its file, a bucket file cut short or unknown to the schema."""
    for name in sorted(pages.keys() - files.keys()):
        return f"the file of {name} is missing"
    for name, (path, page_size) in sorted(files.items()):
        if path.suffix != ".bucket":
            continue
        size = path.stat().st_size
        if size % page_size or size < pages.get(name, 0) * page_size:
            return f"the bucket file {path.name} is cut short ({size} bytes)"
        if name not in named and not name.endswith(("_in_edges", "_out_edges")):
            return f"the bucket file {path.name} is not in its {SCHEMA}"
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
