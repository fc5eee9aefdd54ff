"""resources/qdrant_edge_search.py over stand-in shards: the rankings read no payload, the payloads are read for
the hits kept only, and a point in both shards is the tail's."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from resources.qdrant_base import SearchQuery
from resources.qdrant_edge_search import search_shards


@dataclass
class Scored:
    id: object
    score: float


@dataclass
class Record:
    id: object
    payload: dict


@dataclass
class Shard:
    """A shard ranking its points by a fixed score for either query, and counting what it was asked."""

    scores: dict[object, float]
    payloads: dict[object, dict]
    requests: list = field(default_factory=list)
    retrieved: list = field(default_factory=list)

    def query(self, request):
        self.requests.append(request)
        ranked = sorted(self.scores.items(), key=lambda item: -item[1])[: request.limit]
        return [Scored(i, s) for i, s in ranked]

    def retrieve(self, ids, with_payload, with_vector):
        self.retrieved.extend(ids)
        return [Record(i, self.payloads[i]) for i in ids if i in self.payloads]


def shard(ids, base: float, label: str) -> Shard:
    return Shard({i: base - n / 100 for n, i in enumerate(ids)}, {i: {"chunk_id": f"c{i}", "from": label} for i in ids})


def reading(_folder):
    return nullcontext()


def test_a_hybrid_search_reads_the_payloads_of_the_hits_kept_only():
    main = shard(range(100), 0.9, "main")
    request = SearchQuery("hybrid", [0.1, 0.2], ([1, 2], [1.0, 1.0]), limit=5, candidates=50)
    hits = search_shards([(main, Path("main"))], request, None, 64, reading)
    assert [h.chunk_id for h in hits] == ["c0", "c1", "c2", "c3", "c4"]
    assert len(main.requests) == 2 and all(r.with_payload is False for r in main.requests)
    assert [r.limit for r in main.requests] == [50, 50]
    assert sorted(main.retrieved) == [0, 1, 2, 3, 4]  # not the 50 candidates of either ranking


def test_a_point_in_both_shards_is_the_tails_and_counts_once():
    tail = shard([7, 101], 0.95, "tail")
    main = shard(range(10), 0.9, "main")
    request = SearchQuery("dense", [0.1, 0.2], None, limit=4, candidates=4)
    hits = search_shards([(tail, Path("tail")), (main, Path("main"))], request, None, 64, reading)
    assert [h.chunk_id for h in hits] == ["c7", "c101", "c0", "c1"]
    assert [h.payload["from"] for h in hits] == ["tail", "tail", "main", "main"]
    assert main.retrieved == [0, 1]  # the tail had 7 and 101: main is asked for the rest only
