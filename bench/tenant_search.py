"""A tenant's search on the embedded store: unfiltered vs filtered on tenant_id, with and without its payload index.

One Qdrant Edge shard per variant, seeded alike (N random 384-d points, payloads like docqueue's): a large tenant
holds --big-share of the points, a small one --small-share, the rest spread over other tenants. Both shards have
the document_id index; `indexed` also has the tenant_id keyword index docqueue creates, `unindexed` does not
(a shard as it was before tenants). Each search goes through resources.vector_payload.search_filter and
resources.qdrant_edge_shard.edge_filter, the filter docqueue's search builds. Points stay in the appendable segment
(brute force), the state between two nightly index builds; --optimize builds HNSW first.

Measured per variant: p50 / p95 of --searches queries, unfiltered, tenant=small and tenant=big.
Prints one line per variant and filter and ends with exactly one line `RESULT {json}`.

  .venv/bin/python bench/tenant_search.py [--points 20000] [--searches 30] [--optimize]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import qdrant_edge as qe

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402
from resources.qdrant_edge_shard import edge_filter  # noqa: E402
from resources.vector_payload import point_id, search_filter  # noqa: E402

DIM = 384
SEED_BATCH = 2000
TEXT = "lorem ipsum dolor sit amet " * 8


def tenant_of(index: int, n: int, big_share: float, small_share: float) -> str:
    if index < n * big_share:
        return "big"
    if index < n * (big_share + small_share):
        return "small"
    return f"other{index % 8}"


def build(folder: Path, n: int, indexed: bool, rng: np.random.Generator, shares: tuple[float, float]) -> qe.EdgeShard:
    shard = qe.EdgeShard.create(
        str(folder), qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine))
    )
    for field_name in ("document_id", "tenant_id") if indexed else ("document_id",):
        shard.update(qe.UpdateOperation.create_field_index(field_name, qe.PayloadSchemaType.Keyword))
    for start in range(0, n, SEED_BATCH):
        count = min(SEED_BATCH, n - start)
        vectors = rng.standard_normal((count, DIM), dtype=np.float32)
        shard.update(
            qe.UpdateOperation.upsert_points(
                [
                    qe.Point(
                        point_id(f"chunk-{i}"),
                        vectors[i - start].tolist(),
                        {
                            "document_id": f"doc-{i // 50}",
                            "tenant_id": tenant_of(i, n, *shares),
                            "text": TEXT,
                            "chunk_id": f"chunk-{i}",
                        },
                    )
                    for i in range(start, start + count)
                ]
            )
        )
    return shard


def timed_searches(shard: qe.EdgeShard, queries: np.ndarray, tenant: str | None) -> tuple[dict, int]:
    condition = edge_filter(search_filter(tenant=tenant))
    times, hits = [], 0
    for query in queries:
        started = time.perf_counter()
        points = shard.query(
            qe.QueryRequest(
                limit=10, query=qe.Query.Nearest(query.tolist()), filter=condition, with_payload=True, with_vector=False
            )
        )
        times.append((time.perf_counter() - started) * 1000)
        hits += len(points)
        assert tenant is None or all(p.payload["tenant_id"] == tenant for p in points)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[min(len(times) - 1, int(0.95 * len(times)))], 3),
    }, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--searches", type=int, default=30)
    parser.add_argument("--big-share", type=float, default=0.5)
    parser.add_argument("--small-share", type=float, default=0.01)
    parser.add_argument("--optimize", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    queries = rng.standard_normal((args.searches, DIM), dtype=np.float32)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="tenant-search-") as root:
        for variant, indexed in (("indexed", True), ("unindexed", False)):
            started = time.perf_counter()
            shard = build(
                Path(root) / variant,
                args.points,
                indexed,
                np.random.default_rng(11),
                (args.big_share, args.small_share),
            )
            seed_s = time.perf_counter() - started
            if args.optimize:
                shard.optimize()
            figures[variant] = {"seed_s": round(seed_s, 2)}
            # interleaved rounds, so a noisy neighbour slows every filter alike
            for tenant in (None, "small", "big", None, "small", "big"):
                name = tenant or "unfiltered"
                result, hits = timed_searches(shard, queries, tenant)
                previous = figures[variant].get(name)
                if previous is None or result["p50_ms"] < previous["p50_ms"]:
                    figures[variant][name] = {**result, "hits": hits}
            shard.close()
            for name in ("unfiltered", "small", "big"):
                row = figures[variant][name]
                print(
                    f"{variant:9s} {name:10s} p50 {row['p50_ms']:8.3f} ms  p95 {row['p95_ms']:8.3f} ms  "
                    f"hits {row['hits']}",
                    flush=True,
                )
    ratios = {
        f"{name}_p50_over_unfiltered_{variant}": round(
            figures[variant][name]["p50_ms"] / figures[variant]["unfiltered"]["p50_ms"], 3
        )
        for variant in figures
        for name in ("small", "big")
    }
    ratios.update(
        {
            f"{name}_p50_unindexed_over_indexed": round(
                figures["unindexed"][name]["p50_ms"] / figures["indexed"][name]["p50_ms"], 3
            )
            for name in ("unfiltered", "small", "big")
        }
    )
    print_result(
        {
            "points": args.points,
            "searches": args.searches,
            "optimized": args.optimize,
            "shares": {"big": args.big_share, "small": args.small_share},
            "figures": figures,
            "ratios": ratios,
        },
        sort_keys=True,
    )


if __name__ == "__main__":
    main()
