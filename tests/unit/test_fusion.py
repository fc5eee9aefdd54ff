"""Reciprocal rank fusion and the hybrid search's weights, without a store."""

from __future__ import annotations

from processing.fusion import HYBRID_WEIGHTS, RRF_K, fuse_hybrid, fuse_rrf


def test_fuse_rrf_sums_weighted_reciprocal_ranks_and_breaks_ties_stably():
    fused = fuse_rrf([["a", "b", "c"], ["b", "c", "d"]], k=60)
    assert [key for key, _ in fused] == ["b", "c", "a", "d"]
    assert dict(fused)["b"] == 1 / 62 + 1 / 61 and dict(fused)["d"] == 1 / 63
    # a tie (first in one ranking, second in the other) goes to the heavier ranking's first
    tie = fuse_rrf([["x", "y"], ["y", "x"]], k=60, weights=[1.0, 1.0])
    assert tie[0][1] == tie[1][1] and tie[0][0] == "x"
    assert fuse_rrf([["x", "y"], ["y", "x"]], k=60, weights=[1.0, 2.0])[0][0] == "y"
    assert fuse_rrf([[], []]) == []


def test_fuse_rrf_refuses_a_weight_count_unlike_the_rankings():
    import pytest

    with pytest.raises(ValueError, match="2 rankings but 1 weights"):
        fuse_rrf([["a"], ["b"]], weights=[1.0])


def test_hybrid_fusion_gives_a_tie_to_the_sparse_ranking_and_keeps_the_limit():
    assert RRF_K == 60 and HYBRID_WEIGHTS == {"sparse": 1.0, "dense": 1.0}
    # "s" is first for the words, "d" first for the embedding: equal scores, and the matching words win
    fused = fuse_hybrid(["s", "d", "x"], ["d", "s", "y"], limit=3)
    assert [key for key, _ in fused] == ["s", "d", "x"]
    assert fused[0][1] == fused[1][1] == 1 / 61 + 1 / 62
    assert fuse_hybrid([], [], limit=5) == []
    assert [key for key, _ in fuse_hybrid([], ["a", "b"], limit=1)] == ["a"]
