"""The embedded vector store before and after: qdrant-client local mode vs Qdrant Edge, side by side.

For each N (default 0, 20,000 and 100,000 seeded points: random 384-d vectors, payloads like docqueue's,
written in bulk batches, no model), both stores are seeded in fresh folders and measured the way docqueue
uses them, through resources/ports.VectorStore:

  open      one operation's lock + open + close of the folder (a count on a fresh store)
  write64   one 64-point upsert with its lock, open and close (median of --writes); Edge runs with
            DOCQUEUE_QDRANT_LINGER=0 here, so every write pays its own opening, the worst case
  search    p50 / p95 of --searches queries inside one open session (the engine's own search cost)

Edge is measured twice: as the runs leave it (new points in an appendable segment, searched by brute force)
and after `optimize()`, the nightly job's index build, whose duration is reported too (--no-optimize skips it).
Prints one line per store and N, and ends with exactly one line `RESULT {json}` (figures and local/edge ratios).

  .venv/bin/python bench/vector_store.py [--sizes 0,20000,100000] [--writes 3] [--searches 30] [--no-optimize]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from qdrant_client.http import models as qm
from qdrant_client.local.persistence import CollectionPersistence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402
from resources.ports import ChunkPoint  # noqa: E402
from resources.qdrant_base import PreparedPoint  # noqa: E402
from resources.qdrant_edge import EdgeVectorStore  # noqa: E402
from resources.qdrant_server import ClientVectorStore  # noqa: E402
from resources.vector_payload import point_id  # noqa: E402

DIM = 384
MODEL = "bench-model"
SEED_BATCH = 2000
TEXT = "lorem ipsum dolor sit amet " * 8  # a chunk-sized payload


def payload(index: int) -> dict:
    return {
        "document_id": f"doc-{index // 50}",
        "document_key": f"doc-{index // 50}",
        "filename": "bench.pdf",
        "page_number": index % 50,
        "chunk_index": index % 50,
        "text": TEXT,
        "content_hash": "0" * 64,
        "chunk_id": f"chunk-{index}",
    }


def seed(store, n: int, rng: np.random.Generator) -> float:
    """Bulk seeding in batches of SEED_BATCH points: Edge through its own batched update, local mode straight
    into its sqlite file in one transaction per batch (its upsert commits once per point)."""
    started = time.perf_counter()
    store.ensure_collection()
    batches = (_batch(start, min(SEED_BATCH, n - start), rng) for start in range(0, n, SEED_BATCH))
    if isinstance(store, EdgeVectorStore):
        with store.session():
            for batch in batches:
                store.write_prepared(batch)
    else:
        _seed_local_mode(Path(store.location) / "collection" / store.collection, batches)
    return time.perf_counter() - started


def _batch(start: int, size: int, rng: np.random.Generator) -> list[PreparedPoint]:
    vectors = rng.standard_normal((size, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [
        PreparedPoint(point_id(f"chunk-{start + i}"), vector.tolist(), payload(start + i))
        for i, vector in enumerate(vectors)
    ]


def _seed_local_mode(collection_folder: Path, batches) -> None:
    """Rows in local mode's own format (its key encoding, a pickled PointStruct), written set-based."""
    persistence = CollectionPersistence(str(collection_folder))
    try:
        for batch in batches:
            rows = [
                (
                    CollectionPersistence.encode_key(p.id),
                    sqlite3.Binary(pickle.dumps(qm.PointStruct(id=p.id, vector=p.vector, payload=p.payload))),
                )
                for p in batch
            ]
            with persistence.storage:
                persistence.storage.executemany("INSERT OR REPLACE INTO points VALUES (?, ?)", rows)
    finally:
        persistence.close()


def measure(make_store, n: int, writes: int, searches: int, rng: np.random.Generator) -> dict:
    started = time.perf_counter()
    assert make_store().count() >= n
    open_s = time.perf_counter() - started
    write_s = []
    for round_ in range(writes):
        vectors = rng.standard_normal((64, DIM), dtype=np.float32)
        points = [
            ChunkPoint(f"new-{round_}-{i}", vector, {"document_id": f"new-{round_}", "text": TEXT})
            for i, vector in enumerate(vectors)
        ]
        store = make_store()
        started = time.perf_counter()
        store.upsert(points)
        write_s.append(time.perf_counter() - started)
    store = make_store()
    search_ms = []
    with store.session():
        for _ in range(searches):
            query = rng.standard_normal(DIM, dtype=np.float32)
            started = time.perf_counter()
            hits = store.search(query, limit=5, exclude_document_ids=["doc-1", "doc-2"])
            search_ms.append((time.perf_counter() - started) * 1000)
            assert len(hits) == 5 or not writes  # the written points alone are enough to fill a page
    search_ms.sort()
    return {
        "open_s": round(open_s, 4),
        "write64_s": round(statistics.median(write_s), 4),
        "search_p50_ms": round(search_ms[len(search_ms) // 2], 3),
        "search_p95_ms": round(search_ms[min(len(search_ms) - 1, int(len(search_ms) * 0.95))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,20000,100000")
    parser.add_argument("--writes", type=int, default=3)
    parser.add_argument("--searches", type=int, default=30)
    parser.add_argument("--no-optimize", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Local mode is not recommended")
    result: dict = {"dim": DIM, "writes": args.writes, "searches": args.searches, "sizes": {}, "ratios": {}}
    for n in [int(size) for size in args.sizes.split(",")]:
        row: dict = {}
        with tempfile.TemporaryDirectory(prefix="bench-vs-") as tmp:
            for name, build in (
                ("local", lambda: ClientVectorStore(url=None, path=f"{tmp}/local", model_id=MODEL, dim=DIM)),
                ("edge", lambda: EdgeVectorStore(path=f"{tmp}/edge", model_id=MODEL, dim=DIM, linger_s=0)),
            ):
                rng = np.random.default_rng(n)  # the same points and queries for both stores
                seeded = seed(build(), n, rng)
                row[name] = {"seed_s": round(seeded, 2), **measure(build, n, args.writes, args.searches, rng)}
                print(f"N={n:>7} {name:<15} {json.dumps(row[name])}", flush=True)
                if name == "edge" and not args.no_optimize:
                    started = time.perf_counter()
                    build().optimize()
                    optimized = {
                        "optimize_s": round(time.perf_counter() - started, 2),
                        **build().info(),
                        **measure(build, n, args.writes, args.searches, rng),
                    }
                    row["edge_indexed"] = optimized
                    print(f"N={n:>7} {'edge_indexed':<15} {json.dumps(optimized)}", flush=True)
        result["sizes"][str(n)] = row
        for metric in ("open_s", "write64_s", "search_p50_ms", "search_p95_ms"):
            for edge in ("edge", "edge_indexed"):
                if edge in row and row[edge][metric] > 0:
                    ratio = round(row["local"][metric] / row[edge][metric], 1)
                    result["ratios"][f"{metric}_local_over_{edge}@{n}"] = ratio
    print_result(result, sort_keys=True)


if __name__ == "__main__":
    main()
