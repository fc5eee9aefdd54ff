"""A search of the embedded store's shards (resources/qdrant_edge.py): the tail and the main shard each rank their
points, a point in both counts once as the tail's (the newer write), and a hybrid search fuses the sparse and dense
rankings (processing/fusion.py).

The rankings read point ids and scores only, and the payloads are read afterwards for the hits kept. A payload
read is a random read per point: reading the payloads of both rankings' DOCQUEUE_QDRANT_HYBRID_CANDIDATES
candidates cost about ten times the rankings themselves (4.3 ms against 0.3 ms for 50 dense candidates in a
100,000-point shard), and more on a cold page cache.

A deep look that asks for each hit's `document_id` alone (resources/search_copies.py) reads it from `Owners`, the
documents of the points read before, and the payload store only for the others: the payload store reads a point's
whole payload whatever keys are asked (3.4 ms for 525 points, against 0.5 ms for their ids), and a point's document
never changes (its id derives from its chunk id, which derives from its document's id and page)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import qdrant_edge as qe

from processing.fusion import fuse_hybrid
from resources.ports import SearchHit
from resources.qdrant_base import SPARSE_VECTOR, SearchQuery
from resources.qdrant_edge_shard import dense_search_params

Reading = Callable[[Path], AbstractContextManager]

# the points whose documents a store keeps in memory, the first recorded forgotten first: some 200 bytes each
OWNERS_KEPT = 20_000


class Owners:
    """The chunk id and document id of points read before, at most `kept` of them."""

    KEYS = ["chunk_id", "document_id"]

    def __init__(self, kept: int = OWNERS_KEPT):
        self.kept = kept
        self._owners: dict[int, tuple[str, str]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def get(self, point) -> dict | None:
        owner = self._owners.get(point)
        return None if owner is None else {"chunk_id": owner[0], "document_id": owner[1]}

    def add(self, point, payload: dict) -> None:
        if "chunk_id" not in payload or "document_id" not in payload:
            return
        self._owners[point] = (str(payload["chunk_id"]), str(payload["document_id"]))
        while len(self._owners) > self.kept:
            del self._owners[next(iter(self._owners))]


def search_shards(
    shards: Sequence[tuple[qe.EdgeShard, Path]],
    request: SearchQuery,
    condition,
    hnsw_ef: int,
    reading: Reading,
    owners: Owners | None = None,
) -> list[SearchHit]:
    """The hits of `request` over `shards` (open shards with their folders, the tail first), best first;
    `reading(folder)` wraps each read so that an unreadable file names its shard. A request for the hits'
    documents alone reads them from `owners` where it can, and records there those it reads."""
    sparse = (
        qe.Query.Nearest(qe.SparseVector(*request.sparse), using=SPARSE_VECTOR) if request.sparse is not None else None
    )
    dense = qe.Query.Nearest(request.dense) if request.dense is not None else None
    dense_params = dense_search_params(hnsw_ef)

    ids: dict[int, object] = {}  # the engine's own id (a uuid, or a number) of each point ranked, by its key

    def nearest(query, limit: int) -> list[tuple[int, float]]:
        found: dict[int, float] = {}
        for shard, folder in shards:
            with reading(folder):
                points = shard.query(
                    qe.QueryRequest(
                        limit=limit,
                        query=query,
                        filter=condition,
                        with_payload=False,
                        with_vector=False,
                        params=None if query is sparse else dense_params,
                    )
                )
            for point in points:
                # each read of `id` builds the point's uuid object anew: read once
                point_id = point.id
                key = _key(point_id)
                if key not in found:
                    found[key] = point.score
                    ids.setdefault(key, point_id)
        return sorted(found.items(), key=lambda item: -item[1])[:limit]

    if request.mode == "hybrid":
        ranked = fuse_hybrid(
            [i for i, _ in nearest(sparse, request.candidates)],
            [i for i, _ in nearest(dense, request.candidates)],
            request.limit,
        )
    else:
        ranked = nearest(sparse if request.mode == "sparse" else dense, request.limit)
    wanted = [i for i, _ in ranked]
    if owners is not None and request.with_payload == Owners.KEYS:
        payloads = {i: known for i in wanted if (known := owners.get(i)) is not None}
        read = _payloads(shards, [ids[i] for i in wanted if i not in payloads], reading, Owners.KEYS)
        for point, payload in read.items():
            owners.add(point, payload)
        payloads.update(read)
    else:
        payloads = _payloads(shards, [ids[i] for i in wanted], reading, request.with_payload)
    return [
        SearchHit(score=float(score), chunk_id=str(payloads[i].get("chunk_id", "")), payload=payloads[i])
        for i, score in ranked
        if i in payloads
    ]


def retrieve_first(
    shards: Sequence[tuple[qe.EdgeShard, Path]],
    ids: Sequence,
    reading: Reading,
    with_payload: bool | list[str] = True,
    with_vectors: bool = False,
) -> list:
    """The records of these point ids (uuid objects, their text, or numbers), each from the first of `shards`
    holding it: given the tail first, its copy, the newer write, wins. In the shards' order."""
    found: dict[int, object] = {}
    for shard, folder in shards:
        rest = [i for i in ids if _given_key(i) not in found]
        if not rest:
            break
        with reading(folder):
            for record in shard.retrieve(rest, with_payload, with_vectors):
                found.setdefault(_key(record.id), record)
    return list(found.values())


def _payloads(
    shards: Sequence[tuple[qe.EdgeShard, Path]], ids: list, reading: Reading, with_payload: bool | list[str] = True
) -> dict[int, dict]:
    """The payloads of these point ids (or of their keys `with_payload` lists), by key."""
    return {
        _key(record.id): dict(record.payload or {}) for record in retrieve_first(shards, ids, reading, with_payload)
    }


def _given_key(point_id) -> int:
    """`_key` of an id as a caller gives it: a uuid's text is read as the uuid the engine returns."""
    if isinstance(point_id, str):
        try:
            return uuid.UUID(point_id).int
        except ValueError:
            return int(point_id) if point_id.isdigit() else hash(point_id)
    return _key(point_id)


def _key(point_id) -> int:
    """A point's key in the maps of a search: its uuid's number, or its own number. Hashing a uuid object, or its
    text, is Python code, run a dozen times a point in a deep search; a number's hash is not. The two never meet: a
    point number fits in 64 bits, and a versioned uuid's number does not."""
    return getattr(point_id, "int", point_id)
