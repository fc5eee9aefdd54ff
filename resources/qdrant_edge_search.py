"""A search of the embedded store's shards (resources/qdrant_edge.py): the tail and the main shard each rank their
points, a point in both counts once as the tail's (the newer write), and a hybrid search fuses the sparse and dense
rankings (processing/fusion.py).

The rankings read point ids and scores only, and the payloads are read afterwards for the hits kept. A payload
read is a random read per point: reading the payloads of both rankings' DOCQUEUE_QDRANT_HYBRID_CANDIDATES
candidates cost about ten times the rankings themselves (4.3 ms against 0.3 ms for 50 dense candidates in a
100,000-point shard), and more on a cold page cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import qdrant_edge as qe

from processing.fusion import fuse_hybrid
from resources.ports import SearchHit
from resources.qdrant_base import SPARSE_VECTOR, SearchQuery
from resources.qdrant_edge_shard import dense_search_params

Reading = Callable[[Path], AbstractContextManager]


def search_shards(
    shards: Sequence[tuple[qe.EdgeShard, Path]], request: SearchQuery, condition, hnsw_ef: int, reading: Reading
) -> list[SearchHit]:
    """The hits of `request` over `shards` (open shards with their folders, the tail first), best first;
    `reading(folder)` wraps each read so that an unreadable file names its shard."""
    sparse = (
        qe.Query.Nearest(qe.SparseVector(*request.sparse), using=SPARSE_VECTOR) if request.sparse is not None else None
    )
    dense = qe.Query.Nearest(request.dense) if request.dense is not None else None
    dense_params = dense_search_params(hnsw_ef)

    ids: dict[str, object] = {}  # the engine's own id of each point ranked (a uuid, or a number)

    def nearest(query, limit: int) -> list[tuple[str, float]]:
        found: dict[str, float] = {}
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
                ids.setdefault(str(point.id), point.id)
                found.setdefault(str(point.id), float(point.score))
        return sorted(found.items(), key=lambda item: -item[1])[:limit]

    if request.mode == "hybrid":
        ranked = fuse_hybrid(
            [i for i, _ in nearest(sparse, request.candidates)],
            [i for i, _ in nearest(dense, request.candidates)],
            request.limit,
        )
    else:
        ranked = nearest(sparse if request.mode == "sparse" else dense, request.limit)
    payloads = _payloads(shards, [ids[i] for i, _ in ranked], reading)
    return [
        SearchHit(score=score, chunk_id=str(payloads[i].get("chunk_id", "")), payload=payloads[i])
        for i, score in ranked
        if i in payloads
    ]


def _payloads(shards: Sequence[tuple[qe.EdgeShard, Path]], ids: list, reading: Reading) -> dict[str, dict]:
    """The payloads of these point ids, by their text, each from the first shard holding it (the tail's copy is
    the newer)."""
    found: dict[str, dict] = {}
    for shard, folder in shards:
        rest = [i for i in ids if str(i) not in found]
        if not rest:
            break
        with reading(folder):
            for record in shard.retrieve(rest, True, False):
                found[str(record.id)] = dict(record.payload or {})
    return found
