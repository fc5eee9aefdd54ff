"""Copies in search results: a content group of near-duplicate documents (queue_db/near_duplicates.py) shows as one
hit, its best, saying in how many other documents of the group the text also is and their keys; `all_copies` keeps
every hit and still says so. The group look-up is one query per search, by the hits' document ids.

Collapsing drops hits, so the store is asked for `OVERFETCH` times the hits wanted, and once more for a deeper list
when the copies still left too few."""

from __future__ import annotations

from typing import Callable, Sequence

import sqlalchemy as sa

from processing.copy_choice import best_copy
from queue_db.near_duplicates import copies_of
from resources.ports import MAX_SEARCH_LIMIT, SearchHit

# how many candidates a collapsing search asks the store for, per hit wanted
OVERFETCH = 4
# a copy's hits whose words are compared with the query's, best first: the passage the query names ranks near the
# top of the copy that holds it
COMPARED_PER_DOCUMENT = 3


def collapsed_search(
    search: Callable[[int], Sequence[SearchHit]],
    engine: sa.Engine,
    limit: int,
    *,
    all_copies: bool,
    hidden: Sequence[str] = (),
    query: str | None = None,
) -> tuple[Sequence[SearchHit], list[SearchHit], dict[str, dict]]:
    """Run `search(n)` (the store's best n hits) and keep `limit` of them, one per content group unless
    `all_copies` (the copy shown for a group: the one sharing the most of `query`'s words). Returns what the store
    found, the hits kept, and the group of each kept hit's document."""
    fetch = limit if all_copies else min(limit * OVERFETCH, MAX_SEARCH_LIMIT)
    while True:
        found = search(fetch)
        groups = copies_of(engine, [_document_of(h) for h in found], hidden)
        kept = found[:limit] if all_copies else one_per_group(found, groups, limit, query)
        if all_copies or len(kept) >= limit or len(found) < fetch or fetch >= MAX_SEARCH_LIMIT:
            return found, list(kept), groups
        fetch = min(fetch * OVERFETCH, MAX_SEARCH_LIMIT)


def one_per_group(
    hits: Sequence[SearchHit], groups: dict[str, dict], limit: int, query: str | None = None
) -> list[SearchHit]:
    """The first `limit` hits, best first, one per content group: the group's place is its best hit's, and the hit
    shown for it is the copy whose text shares the most of `query`'s words (processing/copy_choice.py; without a
    query, the best hit)."""
    places: list[list[SearchHit]] = []
    members: dict[str, list[SearchHit]] = {}
    for hit in hits:
        group = groups.get(_document_of(hit), {}).get("group_id")
        if group is not None and group in members:
            members[group].append(hit)
        elif len(places) < limit:  # past `limit` places, only the placed groups' other copies are gathered
            places.append([hit])
            if group is not None:
                members[group] = places[-1]
    return [copies[0] if query is None else best_copy(query, _best_per_document(copies), _text_of) for copies in places]


def _best_per_document(hits: list[SearchHit]) -> list[SearchHit]:
    """Each document's best COMPARED_PER_DOCUMENT hits, in the search's order: the choice is between copies
    (documents), and a deep search of a large group brings dozens of chunks of each, whose words need not all be
    compared (79 hits a group, 70 ms a search, on the planted-copies home of bench/retrieval.py)."""
    seen: dict[str, int] = {}
    kept = []
    for hit in hits:
        document = _document_of(hit)
        seen[document] = seen.get(document, 0) + 1
        if seen[document] <= COMPARED_PER_DOCUMENT:
            kept.append(hit)
    return kept


def _text_of(hit: SearchHit) -> str:
    return str(hit.payload.get("text") or "")


def also_in(hit: SearchHit, groups: dict[str, dict]) -> dict:
    """The hit's `also_in` (how many other documents of its content group there are) and `also_in_keys` (the
    first of their keys)."""
    group = groups.get(_document_of(hit))
    return {"also_in": group["count"], "also_in_keys": group["keys"]} if group else {}


def _document_of(hit: SearchHit) -> str:
    return str(hit.payload.get("document_id"))
