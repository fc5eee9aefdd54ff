"""Copies in search results: a content group of near-duplicate documents (queue_db/near_duplicates.py) shows as one
hit, its best, saying in how many other documents of the group the text also is and their keys; `all_copies` keeps
every hit and still says so.

Collapsing drops hits, so the store is asked for `OVERFETCH` times the hits wanted, and again while the copies
still leave too few (the best hits of a query near a large family are all its copies). A look after the first
leaves out the documents seen (a filter the store applies before ranking), so it stays as shallow as the first and
brings only hits of other documents: ranking and fusing a thousand candidates a side, most of them copies already
seen, cost more than the rest of a collapse. Past NARROW_LOOKS such looks the store is asked DEEPER times deeper.
The looks are light: the hits carry their `document_id` alone, which is all grouping needs (reading the whole
payloads of hundreds of candidates cost most of a search, 8 ms a look on the planted-copies home of
bench/retrieval.py), and the whole payloads are read afterwards in one call, for the hits compared and kept: at
most COMPARED_PER_GROUP a group. A look leaving fewer documents than places wanted is followed by the next without
asking for their groups, and a group look-up asks only for the documents the looks before did not bring"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from processing.copy_choice import best_copy
from queue_db.near_duplicates import copies_of
from resources.ports import MAX_SEARCH_LIMIT, SearchHit, SearchHits

if TYPE_CHECKING:
    import sqlalchemy as sa

# how many candidates a collapsing search asks the store for, per hit wanted
OVERFETCH = 4
# the looks after the first that leave out the documents seen before going deeper: each as shallow as the first,
# its hits all of documents not seen yet; past them (a large group of many documents each holding many hits)
# the looks go deeper
NARROW_LOOKS = 3
# how much deeper each look past the narrowed ones goes, up to MAX_SEARCH_LIMIT: 20 -> 200 -> 1000 for 5 hits. A light
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
# a light look that leaves out the hits of the documents given
Narrowed = Callable[[int, list[str]], Sequence[SearchHit]]


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
    without: Narrowed | None = None,
) -> tuple[Sequence[SearchHit], list[SearchHit], dict[str, dict]]:
    """Run `search(n)` (the store's best n hits) and keep `limit` of them, one per content group unless
    `all_copies` (the copy shown for a group: the one sharing the most of `query`'s words). Given `light(n)` (the
    same ranking, its hits carrying `document_id` only) and `payloads(chunk_ids)`, the looks are light and the
    whole payloads are read once, for the hits compared and kept; given `without(n, documents)` too (a light look
    leaving out those documents' hits), a look after the first asks for hits of documents not seen yet, as
    shallow as the first, NARROW_LOOKS times before looking deeper. Returns what the store found, the hits kept
    (whole payloads), and the group of each kept hit's document."""
    if all_copies:
        found = search(limit)
        return found, list(found[:limit]), copies_of(engine, [_document_of(h) for h in found], hidden)
    look = light if light is not None and payloads is not None else search
    narrow = without if look is light else None
    fetch = min(limit * OVERFETCH, MAX_SEARCH_LIMIT)
    groups: dict[str, dict] = {}
    asked: set[str] = set()
    first = found = look(fetch)
    deeper = len(found) >= fetch and fetch < MAX_SEARCH_LIMIT
    narrowed, guessed, before = 0, [], found
    while True:
        documents = list(dict.fromkeys(map(_document_of, found)))
        # groups only join documents: fewer documents than places wanted need another look whatever their groups
        if not deeper or len(documents) >= limit:
            new = [d for d in documents if d not in asked]
            if new:
                groups.update(copies_of(engine, new, hidden))
                asked.update(new)
            if any(d not in groups for d in guessed):
                # a document left out before its group was known stands alone: its other hits are places of their
                # own, which the look left out; it is looked at again leaving out the grouped documents alone
                found, deeper, guessed = before, True, []
                continue
            places = one_per_group(found, groups, limit, query is not None)
            if len(places) >= limit or not deeper:
                break
        if narrow is not None and narrowed < NARROW_LOOKS:
            # the hits of a grouped document seen only join its group's place; a document standing alone keeps
            # its other hits, and one not looked up yet is taken for grouped (the usual case near a family)
            left_out = [d for d in documents if d in groups or d not in asked]
            guessed = [d for d in left_out if d not in asked]
            more = narrow(fetch, left_out)
            narrowed, before = narrowed + 1, found
            found, deeper = _followed(found, more), len(more) >= fetch
        else:
            fetch = _deeper(fetch)
            found, guessed = look(fetch), []
            deeper = len(found) >= fetch and fetch < MAX_SEARCH_LIMIT
    if look is light and payloads is not None:
        read = payloads(list(dict.fromkeys(h.chunk_id for copies in places for h in copies)))
        # a point deleted since the look is left out
        places = [
            copies
            for copies in ([_whole(h, read) for h in copies if h.chunk_id in read] for copies in places)
            if copies
        ]
    kept = [copies[0] if query is None else best_copy(query, copies, _text_of) for copies in places]
    if found is not first and isinstance(first, SearchHits):
        found = SearchHits(found, mode=first.mode, notice=first.notice)
    return found, kept, groups


def _followed(found: Sequence[SearchHit], more: Sequence[SearchHit]) -> list[SearchHit]:
    """`found` followed by a narrowed look's hits that it does not hold yet, in that order. A hybrid search's fused
    score derives from ranks, and a narrowed look ranks fewer candidates, so a hit of it shows at most the score of
    the hit before it."""
    followed, held = list(found), {h.chunk_id for h in found}
    last = followed[-1].score if followed else None
    for hit in more:
        if hit.chunk_id in held:
            continue
        if last is not None and hit.score > last:
            hit = SearchHit(score=last, chunk_id=hit.chunk_id, payload=hit.payload)
        last = hit.score
        followed.append(hit)
    return followed


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
