"""Content groups of near-duplicate documents in PostgreSQL (migration 0024): a document's signature and LSH bands,
its candidates, the group it joins, and what status, stats and search read about groups.

The signature itself is computed above this floor (processing/near_duplicates.py); here it is a list of NUM_PERM
integers and a list of (band, hash) pairs. Every statement is bounded per document or per search, never by the
corpus: candidates come from one primary-key probe per band, each probe stopping after `max_candidates` rows, and
group look-ups go through the members' group index.

Joining is idempotent and safe under at-least-once execution: a signature is upserted, its bands replaced, and a
document already in a group stays there. Joins of one tenant are serialised by a transaction-level advisory lock,
so two copies finishing at the same moment still find each other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import sqlalchemy as sa


# "also in N documents" lists the keys of at most this many other members per hit
LISTED_COPIES = 20

_CANDIDATES = """
WITH mine AS (SELECT * FROM unnest(%(bands)s::smallint[], %(hashes)s::bigint[]) AS v(band, hash)),
probed AS (
    SELECT DISTINCT hit.document_id FROM mine CROSS JOIN LATERAL (
        SELECT b.document_id FROM document_signature_bands b
        WHERE b.band = mine.band AND b.hash = mine.hash AND b.document_id <> %(d)s
        LIMIT %(max)s) hit)
SELECT c.id::text AS id, m.group_id::text AS group_id,
       (SELECT count(*) FROM unnest(s.minhash, %(minhash)s::integer[]) AS u(x, y) WHERE x = y)::real
           / cardinality(%(minhash)s::integer[]) AS similarity
FROM probed p
JOIN documents c ON c.id = p.document_id AND c.tenant_id = %(tenant)s
-- a signature of another format estimates nothing about this one
JOIN document_signatures s ON s.document_id = p.document_id AND s.format = %(format)s
LEFT JOIN content_group_members m ON m.document_id = p.document_id
-- a document already in a group stays there: no candidate
WHERE NOT EXISTS (SELECT 1 FROM content_group_members mine WHERE mine.document_id = %(d)s)
ORDER BY similarity DESC, c.created_at, c.id
LIMIT 1
"""


@dataclass(frozen=True)
class GroupPlacement:
    """Where a document stands after its signature was recorded: its group (None: no near duplicate), the
    similarity it joined with, and how many other documents the group holds."""

    document_id: str
    group_id: str | None
    similarity: float | None
    copies: int
    representative_key: str | None


def record_signature(
    engine: sa.Engine,
    document_id: str,
    minhash: Sequence[int],
    bands: Sequence[tuple[int, int]],
    shingles: int,
    *,
    signature_format: int,
    threshold: float,
    max_candidates: int,
) -> GroupPlacement:
    """Store the document's signature (of `signature_format`) and bands, then place it: it joins the group of its
    most similar candidate of the same tenant and signature format when their estimated Jaccard similarity is at
    least `threshold` (the two start a group when the candidate has none). One transaction."""
    # a few round trips, each a statement bounded by the document: the transaction's cost is mostly their latency
    with engine.begin() as conn:
        tenant = conn.exec_driver_sql(
            """SELECT tenant_id, pg_advisory_xact_lock(hashtextextended('docqueue-content-groups:' || tenant_id, 0))
               FROM documents WHERE id = %(d)s""",
            {"d": document_id},
        ).scalar()
        if tenant is None:  # deleted meanwhile: nothing to place
            return GroupPlacement(document_id, None, None, 0, None)
        _store_signature(conn, document_id, minhash, bands, shingles, signature_format)
        best = (
            conn.exec_driver_sql(
                _CANDIDATES,
                {
                    "bands": [b for b, _ in bands],
                    "hashes": [h for _, h in bands],
                    "d": document_id,
                    "max": int(max_candidates),
                    "minhash": list(minhash),
                    "tenant": tenant,
                    "format": int(signature_format),
                },
            )
            .mappings()
            .first()
        )
        if best is not None and best["similarity"] >= threshold:
            _join(conn, document_id, tenant, dict(best))
        return _placement(conn, document_id)


def _store_signature(conn, document_id: str, minhash, bands, shingles: int, signature_format: int) -> None:
    """The signature upserted and the band rows replaced by the new set, in one statement (its sub-statements run
    whether or not anything reads them): a band row that stays is neither deleted nor written again."""
    conn.exec_driver_sql(
        """WITH new_bands AS (SELECT * FROM unnest(%(bands)s::smallint[], %(hashes)s::bigint[]) AS v(band, hash)),
           signed AS (
               INSERT INTO document_signatures (document_id, minhash, shingles, format)
               VALUES (%(d)s, %(m)s, %(n)s, %(f)s)
               ON CONFLICT (document_id) DO UPDATE SET minhash = EXCLUDED.minhash, shingles = EXCLUDED.shingles,
                   format = EXCLUDED.format, computed_at = now()
               WHERE (document_signatures.minhash, document_signatures.format)
                   IS DISTINCT FROM (EXCLUDED.minhash, EXCLUDED.format)),
           stale AS (
               DELETE FROM document_signature_bands b WHERE b.document_id = %(d)s
               AND (b.band, b.hash) NOT IN (SELECT band, hash FROM new_bands))
           INSERT INTO document_signature_bands (band, hash, document_id)
           SELECT band, hash, %(d)s FROM new_bands
           ON CONFLICT DO NOTHING""",
        {
            "d": document_id,
            "m": list(minhash),
            "n": int(shingles),
            "f": int(signature_format),
            "bands": [b for b, _ in bands],
            "hashes": [h for _, h in bands],
        },
    )


def _join(conn, document_id: str, tenant: str, best: dict) -> None:
    group_id = best["group_id"]
    if group_id is None:
        group_id = conn.exec_driver_sql(
            """INSERT INTO content_groups (tenant_id, representative_id) VALUES (%(t)s, %(rep)s) RETURNING id::text""",
            {"t": tenant, "rep": best["id"]},
        ).scalar_one()
        _add_member(conn, best["id"], group_id, best["similarity"], document_id)
    _add_member(conn, document_id, group_id, best["similarity"], best["id"])
    # the representative is the earliest registered member
    conn.exec_driver_sql(
        """UPDATE content_groups g SET representative_id = %(d)s
           FROM documents mine, documents rep
           WHERE g.id = %(g)s AND mine.id = %(d)s AND rep.id = g.representative_id
             AND (mine.created_at, mine.id) < (rep.created_at, rep.id)""",
        {"g": group_id, "d": document_id},
    )


def _add_member(conn, document_id: str, group_id: str, similarity: float, matched: str) -> None:
    conn.exec_driver_sql(
        """INSERT INTO content_group_members (document_id, group_id, similarity, matched_document_id)
           VALUES (%(d)s, %(g)s, %(s)s, %(m)s) ON CONFLICT (document_id) DO NOTHING""",
        {"d": document_id, "g": group_id, "s": float(similarity), "m": matched},
    )


def _placement(conn, document_id: str) -> GroupPlacement:
    row = (
        conn.exec_driver_sql(
            """SELECT m.group_id::text AS group_id, m.similarity, rep.document_key AS representative_key,
                      (SELECT count(*) - 1 FROM content_group_members o WHERE o.group_id = m.group_id) AS copies
               FROM content_group_members m JOIN content_groups g ON g.id = m.group_id
               LEFT JOIN documents rep ON rep.id = g.representative_id
               WHERE m.document_id = %(d)s""",
            {"d": document_id},
        )
        .mappings()
        .first()
    )
    if row is None:
        return GroupPlacement(document_id, None, None, 0, None)
    return GroupPlacement(
        document_id, row["group_id"], round(float(row["similarity"]), 4), int(row["copies"]), row["representative_key"]
    )


def signed_in_other_format(
    engine: sa.Engine, signature_format: int, after: str | None = None, limit: int = 500
) -> list[dict]:
    """Documents whose signature is of a format older than `signature_format` (an older docqueue's), in id order
    after `after`, at most `limit`: rows with id, document_key and pages, as the OCR roll-up hands documents to be
    signed. Through the signatures' format index, so each batch costs its own rows."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT d.id::text AS id, d.document_key, COALESCE(d.page_count, 0) AS pages
               FROM document_signatures s JOIN documents d ON d.id = s.document_id
               WHERE s.format < %(f)s AND (%(after)s::uuid IS NULL OR s.document_id > %(after)s::uuid)
               ORDER BY s.document_id LIMIT %(n)s""",
            {"f": int(signature_format), "after": after, "n": int(limit)},
        )
        return [dict(row) for row in rows.mappings()]


def forget_signature(engine: sa.Engine, document_id: str) -> None:
    """Remove a document's signature and bands (its text holds no word any more: it has no copies); its group
    membership stays, as a document keeps its group."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM document_signature_bands WHERE document_id = %(d)s", {"d": document_id})
        conn.exec_driver_sql("DELETE FROM document_signatures WHERE document_id = %(d)s", {"d": document_id})


def copies_of(
    engine: sa.Engine, document_ids: Sequence[str], exclude_document_ids: Sequence[str] = ()
) -> dict[str, dict]:
    """Per given document that sits in a content group: its group id, representative key, similarity, and the
    other members (`count`, and the keys of the first LISTED_COPIES to join), leaving out `exclude_document_ids`
    (versions search hides). One statement: the given documents' memberships by primary key, then once per group
    its members through the group index, which lists the first few in joining order without reading a large
    group's rows (its count is an index-only count)."""
    # a point whose payload names no queue document (written by another program into a shared collection) is in
    # no group; its id must not reach the uuid cast
    document_ids = [d for d in dict.fromkeys(document_ids) if _is_uuid(d)]
    if not document_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """WITH hit AS (SELECT document_id, group_id, similarity FROM content_group_members
                            WHERE document_id = ANY(%(ids)s::uuid[])),
               -- once per group, however many of the hits it holds
               grp AS MATERIALIZED (
                   SELECT g.id AS gid, rep.document_key AS representative, n.count, o.ids, o.keys
                   FROM content_groups g LEFT JOIN documents rep ON rep.id = g.representative_id
                   CROSS JOIN LATERAL (
                       SELECT count(*) AS count FROM content_group_members x
                       WHERE x.group_id = g.id AND x.document_id <> ALL(%(hidden)s::uuid[])) n
                   CROSS JOIN LATERAL (
                       SELECT array_agg(f.document_id::text ORDER BY f.joined_at, f.document_id) AS ids,
                              array_agg(f.document_key ORDER BY f.joined_at, f.document_id) AS keys
                       FROM (SELECT x.document_id, x.joined_at, d.document_key
                             FROM content_group_members x JOIN documents d ON d.id = x.document_id
                             WHERE x.group_id = g.id AND x.document_id <> ALL(%(hidden)s::uuid[])
                             ORDER BY x.joined_at, x.document_id LIMIT %(listed)s + 1) f) o
                   WHERE g.id IN (SELECT group_id FROM hit))
               SELECT hit.document_id::text AS id, hit.group_id::text AS group_id, hit.similarity,
                      grp.representative, grp.count, grp.ids, grp.keys
               FROM hit JOIN grp ON grp.gid = hit.group_id""",
            {"ids": document_ids, "hidden": list(exclude_document_ids), "listed": LISTED_COPIES},
        ).mappings()
        hidden = {str(d) for d in exclude_document_ids}
        return {r["id"]: _copies(r, r["id"] in hidden) for r in rows}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _copies(row, hidden: bool) -> dict:
    """A member's view of its group: the others, itself left out of the keys listed and of the count (where a
    hidden member is not counted anyway)."""
    others = [key for member, key in zip(row["ids"] or [], row["keys"] or []) if member != row["id"]]
    return {
        "group_id": row["group_id"],
        "representative": row["representative"],
        "similarity": round(float(row["similarity"]), 4),
        "count": int(row["count"]) - (0 if hidden else 1),
        "keys": others[:LISTED_COPIES],
    }


def group_counts(engine: sa.Engine, tenant: str | None = None) -> dict[str, int]:
    """How many content groups there are and how many documents they hold beyond their representatives (the
    copies): index-only counts over the group tables, which hold grouped documents only; of one tenant's groups
    through their tenant index when `tenant` is given."""
    where = "WHERE g.tenant_id = %(t)s" if tenant is not None else ""
    with engine.connect() as conn:
        groups, members = conn.exec_driver_sql(
            f"""SELECT (SELECT count(*) FROM content_groups g {where}),
                       (SELECT count(*) FROM content_group_members m
                        {"JOIN content_groups g ON g.id = m.group_id " + where if where else ""})""",
            {"t": tenant},
        ).one()
    return {"groups": int(groups), "grouped_documents": int(members), "copies": int(members) - int(groups)}
