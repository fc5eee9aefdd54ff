"""Reciprocal rank fusion: how a hybrid search merges its sparse and dense rankings into one.

The fusion is done here rather than by the vector store because neither Qdrant backend weighs or orders ties the
same way; one rule, applied to both rankings' chunk ids, gives the same hits on every backend and every run.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

RRF_K = 60
# The sparse ranking goes first, so a tie (first in one list, second in the other) goes to the chunk whose words
# match: near-duplicates are a tie for the embedding. Equal weights: neither side is trusted more.
HYBRID_WEIGHTS = {"sparse": 1.0, "dense": 1.0}


def fuse_rrf(
    rankings: Sequence[Sequence[K]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[K, float]]:
    """Reciprocal rank fusion: each key scores sum(weight / (k + rank)) over the rankings it is in (rank from 1).

    Best first; equal scores keep the order of the heavier ranking, then of the earlier one, so the result is the
    same on every backend and every run.
    """
    weights = list(weights) if weights else [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    scores: dict[K, float] = {}
    first_seen: dict[K, tuple[float, int, int]] = {}
    for r, (ranking, weight) in enumerate(zip(rankings, weights)):
        for rank, key in enumerate(ranking, start=1):
            # a deep hybrid search fuses two rankings of a thousand: one lookup a key, one tuple
            seen, before = (-weight, r, rank), first_seen.get(key)
            if before is None:
                scores[key], first_seen[key] = weight / (k + rank), min(seen, (0.0, len(rankings), rank))
            else:
                scores[key] += weight / (k + rank)
                if seen < before:
                    first_seen[key] = seen
    return sorted(scores.items(), key=lambda item: (-item[1], first_seen[item[0]]))


def fuse_hybrid(sparse_ids: Sequence[K], dense_ids: Sequence[K], limit: int) -> list[tuple[K, float]]:
    """The best `limit` of a hybrid search: RRF over the sparse ranking (first) and the dense one."""
    fused = fuse_rrf([sparse_ids, dense_ids], k=RRF_K, weights=[HYBRID_WEIGHTS["sparse"], HYBRID_WEIGHTS["dense"]])
    return fused[:limit]
