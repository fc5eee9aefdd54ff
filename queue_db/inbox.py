"""What the inbox sensor has already read: each file's path with the size and modification time it had then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    import sqlalchemy as sa


def unchanged(engine: sa.Engine, observed: Mapping[str, tuple[int, int]]) -> set[str]:
    """The paths among `observed` (path -> (size, mtime_ns)) read before with the same size and time."""
    if not observed:
        return set()
    paths = list(observed)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT source_path, size_bytes, mtime_ns FROM inbox_files WHERE source_path = ANY(%(p)s)", {"p": paths}
        ).all()
    return {r[0] for r in rows if observed.get(r[0]) == (int(r[1]), int(r[2]))}


def remember(engine: sa.Engine, seen: Sequence[tuple[str, int, int, str | None, str]]) -> None:
    """Record files just read: (path, size, mtime_ns, document id or None, outcome)."""
    if not seen:
        return
    with engine.begin() as conn:
        conn.exec_driver_sql(
            """INSERT INTO inbox_files (source_path, size_bytes, mtime_ns, document_id, outcome)
               SELECT * FROM unnest(%(p)s::text[], %(s)s::bigint[], %(m)s::bigint[], %(d)s::uuid[], %(o)s::text[])
               ON CONFLICT (source_path) DO UPDATE
                   SET size_bytes = EXCLUDED.size_bytes, mtime_ns = EXCLUDED.mtime_ns,
                       document_id = EXCLUDED.document_id, outcome = EXCLUDED.outcome, seen_at = now()""",
            {
                "p": [s[0] for s in seen],
                "s": [s[1] for s in seen],
                "m": [s[2] for s in seen],
                "d": [s[3] for s in seen],
                "o": [s[4] for s in seen],
            },
        )
