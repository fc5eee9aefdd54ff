"""Copies in search results: a content group of near-duplicate documents (queue_db/near_duplicates.py) shows as one
hit, its best, saying in how many other documents of the group the text also is and their keys; `all_copies` keeps
every hit and still says so.

Collapsing drops hits, so the store is asked for `OVERFETCH` times the hits wanted, and again, DEEPER times deeper,
while the copies still leave too few (the best hits of a query near a large family are all its copies). The looks
are light: the hits carry their `document_id` alone, which is all grouping needs (reading the whole payloads of
hundreds of candidates cost most of a search, 8 ms a look on the planted-copies home of bench/retrieval.py), and
the whole payloads are read afterwards in one call, for the hits compared and kept: at most COMPARED_PER_GROUP a
group. A first look holding fewer documents than places wanted goes deeper without asking for their groups, and
the group look-up after a deeper look asks only for the documents the first did not."""

from __future__ import annotations

from typing import Callable, Sequence

import sqlalchemy as sa

from processing.copy_choice import best_copy
from queue_db.near_duplicates import copies_of
from resources.ports import MAX_SEARCH_LIMIT, SearchHit

# how many candidates a collapsing search asks the store for, per hit wanted
OVERFETCH = 4
# how much deeper each look after the first goes, up to MAX_SEARCH_LIMIT: 20 -> 200 -> 1000 for 5 hits. A light
# look's fixed part (the store's lock, the rankings, a group look-up) costs more than its depth, so few looks
# (20 -> 80 -> 320 -> 1000 took 35-41 ms a search on the planted-copies home), but the rankings and their fusion
# are Python over every candidate, so not straight to the deepest when a shallower look would do
DEEPER = 10
# a copy's hits whose words are compared with the query's, best first: the passage the query names ranks near the
# top of the copy that holds it
COMPARED_PER_DOCUMENT = 3
# the hits of one group whose words are compared, best first: the payloads read for a group stay bounded however
# many copies it has
COMPARED_PER_GROUP = 30
# the payload keys a deeper look reads
LIGHT_KEYS = ("document_id",)

Search = Callable[[int], Sequence[SearchHit]]


def collapsed_search(
    search: Search,
    engine: sa.Engine,
    limit: int,
    *,
    all_copies: bool,
    hidden: Sequence[str] = (),
    query: str | None = None,
    light: Search | None = None,
    payloads: Callable[[list[str]], dict[str, dict]] | None = None,
) -> tuple[Sequence[SearchHit], list[SearchHit], dict[str, dict]]:
    """Run `search(n)` (the store's best n hits) and keep `limit` of them, one per content group unless
    `all_copies` (the copy shown for a group: the one sharing the most of `query`'s words). Given `light(n)` (the
    same ranking, its hits carrying `document_id` only) and `payloads(chunk_ids)`, the looks are light and the
    whole payloads are read once, for the hits compared and kept. Returns what the store found, the hits kept
    (whole payloads), and the group of each kept hit's document."""
    if all_copies:
        found = search(limit)
        return found, list(found[:limit]), copies_of(engine, [_document_of(h) for h in found], hidden)
    look = light if light is not None and payloads is not None else search
    fetch = min(limit * OVERFETCH, MAX_SEARCH_LIMIT)
    groups: dict[str, dict] = {}
    asked: set[str] = set()
    while True:
        found = look(fetch)
        documents = list(dict.fromkeys(map(_document_of, found)))
        deeper = len(found) >= fetch and fetch < MAX_SEARCH_LIMIT
        # groups only join documents: fewer documents than places wanted need a deeper look whatever their groups
        if deeper and len(documents) < limit:
            fetch = _deeper(fetch)
            continue
        new = [d for d in documents if d not in asked]
        if new:
            groups.update(copies_of(engine, new, hidden))
            asked.update(new)
        places = one_per_group(found, groups, limit, query is not None)
        if len(places) >= limit or not deeper:
            break
        fetch = _deeper(fetch)
    if look is light and payloads is not None:
        read = payloads(list(dict.fromkeys(h.chunk_id for copies in places for h in copies)))
        # a point deleted since the look is left out
        places = [
            copies
            for copies in ([_whole(h, read) for h in copies if h.chunk_id in read] for copies in places)
            if copies
        ]
    kept = [copies[0] if query is None else best_copy(query, copies, _text_of) for copies in places]
    return found, kept, groups


def _deeper(fetch: int) -> int:
    """The next look's depth: DEEPER times this one's, at most MAX_SEARCH_LIMIT (so the looks end)."""
    return min(fetch * DEEPER, MAX_SEARCH_LIMIT)


def one_per_group(
    hits: Sequence[SearchHit], groups: dict[str, dict], limit: int, compared: bool
) -> list[list[SearchHit]]:
    """The first `limit` places, best first, one per content group: a group's place is its best hit's, and holds
    (with `compared`) the hits whose words decide which copy shows (processing/copy_choice.py): each copy's best
    COMPARED_PER_DOCUMENT, at most COMPARED_PER_GROUP, best first; without, the best hit alone."""
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
    if not compared:
        return [copies[:1] for copies in places]
    return [_best_per_document(copies)[:COMPARED_PER_GROUP] for copies in places]


def _whole(hit: SearchHit, payloads: dict[str, dict]) -> SearchHit:
    return SearchHit(score=hit.score, chunk_id=hit.chunk_id, payload=payloads[hit.chunk_id])


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
