"""Near-duplicate documents: what a document's signature, banding and candidate look-up cost, how well the groups
match planted copies, and the search latency collapsing copies adds.

A generated corpus (word pages drawn from a Zipf vocabulary, seeded): per family a document and its planted near
copies, alternately versions with one to three words changed per page and re-scans with OCR-like letter errors in
about 2 % of the words; documents that share one boilerplate page with the others but differ otherwise, and for
every fifth family one that shares all pages but the last with its original (Jaccard about 0.5): not copies;
unique documents. A throwaway queue database first holds --background documents with random signatures and
bands (24 band rows each), so the look-ups run against a table of that size; the corpus documents are then signed
(processing/near_duplicates.py) and placed (queue_db/near_duplicates.record_signature) one at a time, as the OCR
roll-up does.

Measured:
  per document   signature ms, placement ms (bands written, candidates found through the band index, compared
                 and joined; one transaction), p50 / p95
  groups         pair precision and recall of the content groups against the planted families at
                 DOCQUEUE_NEAR_DUP_THRESHOLD's default, and the pairwise estimate's precision and recall at other
                 thresholds (from the signatures: what the default was chosen from)
  search         on an embedded Qdrant Edge store holding one point per corpus page (random 384-d vectors, dense
                 search): p50 / p95 of the store's search alone (limit 5), and of the collapsing search (4x over-fetch,
                 the group query by the hits' document ids, one hit per group); the difference is what collapsing adds

  .venv/bin/python bench/near_duplicates.py [--families 300] [--background 100000] [--admin-url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
VOCABULARY = [f"w{i}" for i in range(8000)]
WEIGHTS = [1 / (rank + 1) ** 0.8 for rank in range(len(VOCABULARY))]
DIM = 384


def pages(rng: random.Random, count: int, words: int) -> list[list[str]]:
    return [rng.choices(VOCABULARY, WEIGHTS, k=words) for _ in range(count)]


def version(rng: random.Random, original: list[list[str]], changed: int) -> list[list[str]]:
    copy = [list(page) for page in original]
    for page in copy:
        for at in rng.sample(range(len(page)), changed):
            page[at] = f"edit{rng.randrange(10**6)}"
    return copy


def rescan(rng: random.Random, original: list[list[str]], error_rate: float = 0.02) -> list[list[str]]:
    """OCR-like errors: a letter of about `error_rate` of the words read wrong."""
    return [[w[:-1] + "x" if rng.random() < error_rate else w for w in page] for page in original]


def corpus(families: int, page_count: int, words: int, seed: int = 7) -> list[tuple[str, list[str]]]:
    """(family, page texts) per document, in registration order: a family of planted copies has a name starting
    with `f`; the boilerplate documents and the unique ones are each a family of one."""
    rng = random.Random(seed)
    documents: list[tuple[str, list[list[str]]]] = []
    boilerplate = pages(rng, 1, words)[0]
    for family in range(families):
        original = pages(rng, page_count, words)
        documents.append((f"f{family}", original))
        for copy in range(1 + family % 3):
            near = version(rng, original, 1 + copy) if family % 2 == 0 else rescan(rng, original)
            documents.append((f"f{family}", near))
        documents.append((f"boilerplate{family}", [boilerplate, *pages(rng, page_count - 1, words)]))
        if family % 5 == 0:  # another document that shares all but one page with it: half its shingles, no copy
            documents.append((f"half{family}", [*original[: page_count - 1], *pages(rng, 1, words)]))
        documents.append((f"unique{family}", pages(rng, page_count, words)))
    order = list(range(len(documents)))
    rng.shuffle(order)
    return [(documents[i][0], [" ".join(page) for page in documents[i][1]]) for i in order]


@contextlib.contextmanager
def throwaway_database(admin_url: str) -> Iterator[str]:
    """A database of its own, dropped at the end (without bench/dagster_storage.py's: that one imports Dagster)."""
    import sqlalchemy as sa

    from queue_db.queue import create_queue_engine

    name = f"bench_near_dup_{uuid.uuid4().hex[:8]}"
    admin = create_queue_engine(admin_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.engine.dispose()


def seed_background(engine, n: int) -> float:
    """`n` documents with random signatures (of the current format, so candidates are compared with them) and
    bands, set-based."""
    from processing.near_duplicates import FORMAT

    started = time.perf_counter()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, document_key, content_hash, size_bytes)
               SELECT 'bg-' || n || '.pdf', 'bg-' || n, md5('bg' || n) || md5('bg' || n), 1000
               FROM generate_series(1, %(n)s) n""",
            {"n": n},
        )
        conn.exec_driver_sql(
            """INSERT INTO document_signatures (document_id, minhash, shingles, format)
               -- the WHERE ties the subquery to the row, so each document draws its own values
               SELECT id, ARRAY(SELECT (random() * 2147483646)::int FROM generate_series(1, 120)
                                WHERE d.id IS NOT NULL), 400, %(format)s
               FROM documents d WHERE d.filename LIKE 'bg-%%'""",
            {"format": FORMAT},
        )
        conn.exec_driver_sql(
            """INSERT INTO document_signature_bands (band, hash, document_id)
               SELECT b, (random() * 9.2e18 - 4.6e18)::bigint, d.id
               FROM documents d CROSS JOIN generate_series(0, 23) b WHERE d.filename LIKE 'bg-%%'"""
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "ANALYZE documents, document_signatures, document_signature_bands"
        )
    return time.perf_counter() - started


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


def place_corpus(queue, documents, threshold: float, max_candidates: int) -> tuple[dict, list, list]:
    from processing.near_duplicates import FORMAT, signature
    from queue_db.near_duplicates import record_signature
    from tests.queue_support import new_hash

    sign_ms, place_ms, placed = [], [], []
    for index, (family, texts) in enumerate(documents):
        doc, _ = queue.register_document(filename=f"{family}-{index}.pdf", content_hash=new_hash(), size_bytes=1)
        started = time.perf_counter()
        signed = signature(texts)
        signed_at = time.perf_counter()
        assert signed is not None
        record_signature(
            queue.engine,
            str(doc["id"]),
            signed.values,
            signed.bands(),
            signed.shingles,
            signature_format=FORMAT,
            threshold=threshold,
            max_candidates=max_candidates,
        )
        sign_ms.append((signed_at - started) * 1000)
        place_ms.append((time.perf_counter() - signed_at) * 1000)
        placed.append((str(doc["id"]), family, signed))
    return {"signature_ms": percentiles(sign_ms), "placement_ms": percentiles(place_ms)}, placed, sign_ms


def pair_scores(predicted: set, truth: set) -> dict:
    hit = len(predicted & truth)
    return {
        "precision": round(hit / len(predicted), 4) if predicted else 1.0,
        "recall": round(hit / len(truth), 4) if truth else 1.0,
    }


def group_quality(queue, placed) -> dict:
    """Pair precision and recall of the stored groups, and of the pairwise estimate at other thresholds."""
    from processing.near_duplicates import estimated_jaccard

    family_of = {doc_id: family for doc_id, family, _ in placed}
    truth = set()
    by_family: dict[str, list[str]] = {}
    for doc_id, family, _ in placed:
        by_family.setdefault(family, []).append(doc_id)
    for members in by_family.values():
        truth |= {frozenset(p) for p in itertools.combinations(members, 2)}
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT group_id::text, document_id::text FROM content_group_members").all()
    groups: dict[str, list[str]] = {}
    for group_id, doc_id in rows:
        if doc_id in family_of:
            groups.setdefault(group_id, []).append(doc_id)
    predicted = {frozenset(p) for members in groups.values() for p in itertools.combinations(members, 2)}
    quality = {"groups": pair_scores(predicted, truth), "planted_pairs": len(truth), "grouped_pairs": len(predicted)}
    # every pair within a family, and every pair sharing a boilerplate page or nothing (a sample), by estimate
    signatures = {doc_id: sig for doc_id, _, sig in placed}
    rng = random.Random(1)
    # the hard cases first: a document sharing all pages but one with a family, boilerplate sharers among them
    others = {
        frozenset((doc_id, member))
        for family, members in by_family.items()
        if family.startswith("half")
        for doc_id in members
        for member in by_family.get("f" + family[len("half") :], [])
    }
    sharers = [d for family, members in by_family.items() if family.startswith("boilerplate") for d in members]
    others |= {frozenset(rng.sample(sharers, 2)) for _ in range(min(2000, len(sharers) // 2))}
    ids = list(signatures)
    wanted = min(len(others) + 20 * len(truth), len(ids) * (len(ids) - 1) // 2 - len(truth))
    while len(others) < wanted:
        pair = frozenset(rng.sample(ids, 2))
        if pair not in truth:
            others.add(pair)
    estimates = {pair: estimated_jaccard(*(signatures[d] for d in pair)) for pair in truth | others}
    for threshold in (0.6, 0.7, 0.8, 0.9):
        quality[f"pairs_at_{threshold}"] = pair_scores({p for p, e in estimates.items() if e >= threshold}, truth)
    quality["lowest_planted_estimate"] = round(min(estimates[p] for p in truth), 3) if truth else None
    quality["highest_other_estimate"] = round(max(estimates[p] for p in others), 3) if others else None
    quality["other_pairs"] = len(others)
    return quality


def search_latency(queue, placed, searches: int, folder: str) -> dict:
    import numpy as np

    from queue_db.lifecycle import hidden_from_search
    from resources.ports import ChunkPoint
    from resources.qdrant_edge import EdgeVectorStore
    from resources.search_copies import collapsed_search
    from resources.vector_payload import chunk_payload

    rng = np.random.default_rng(3)
    store = EdgeVectorStore(path=folder, model_id="bench-near-duplicates", dim=DIM)
    store.ensure_collection()
    points = []
    for doc_id, family, _ in placed:
        # a family's copies sit close together, as the embeddings of near-identical text do
        base = np.random.default_rng(abs(hash(family)) % 2**32).standard_normal(DIM)
        for page in range(3):
            vector = (base + 0.05 * rng.standard_normal(DIM) + 0.3 * page).astype(np.float32)
            payload = chunk_payload(
                document_id=doc_id,
                document_key=doc_id,
                tenant_id="default",
                filename=family,
                page_number=page + 1,
                chunk_index=0,
                text=family,
                content_hash=doc_id,
                tokens=1,
                embedded_tokens=1,
            )
            points.append(ChunkPoint(f"{doc_id}-{page}", vector, payload))
    for start in range(0, len(points), 2000):
        store.upsert(points[start : start + 2000])
    plain, collapsed, query_only = [], [], []
    from queue_db.near_duplicates import copies_of

    for _ in range(searches + 3):  # the first three warm the store and the pool
        query = rng.standard_normal(DIM).astype(np.float32)
        hidden = hidden_from_search(queue)
        started = time.perf_counter()
        found = store.search(query, limit=5, mode="dense", exclude_document_ids=hidden)
        plain.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        collapsed_search(
            lambda n: store.search(query, limit=n, mode="dense", exclude_document_ids=hidden),
            queue.engine,
            5,
            all_copies=False,
            hidden=hidden,
        )
        collapsed.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        copies_of(queue.engine, [h.payload["document_id"] for h in found], hidden)
        query_only.append((time.perf_counter() - started) * 1000)
    store.close()
    plain, collapsed, query_only = plain[3:], collapsed[3:], query_only[3:]
    return {
        "points": len(points),
        "search_ms": percentiles(plain),
        "collapsed_search_ms": percentiles(collapsed),
        "group_query_ms": percentiles(query_only),
        "added_p95_ms": round(percentiles(collapsed)["p95"] - percentiles(plain)["p95"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=300, help="families of planted copies (each adds 2 more)")
    parser.add_argument("--pages", type=int, default=3, help="pages per document")
    parser.add_argument("--words", type=int, default=150, help="words per page")
    parser.add_argument("--background", type=int, default=100_000, help="documents already signed")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--threshold", type=float, help="DOCQUEUE_NEAR_DUP_THRESHOLD (default: its default)")
    parser.add_argument("--admin-url", default=os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL", DEFAULT_ADMIN_URL))
    args = parser.parse_args(argv)

    from queue_db.config import NearDuplicateConfig
    from queue_db.migrate import upgrade
    from queue_db.queue import TaskQueue, create_queue_engine

    config = NearDuplicateConfig.model_construct()  # the defaults, as a user's environment has them
    threshold = args.threshold if args.threshold is not None else config.threshold
    documents = corpus(args.families, args.pages, args.words)
    with throwaway_database(args.admin_url) as url, tempfile.TemporaryDirectory() as folder:
        engine = create_queue_engine(url)
        upgrade(engine)
        queue = TaskQueue(engine)
        seeded = seed_background(engine, args.background) if args.background else 0.0
        print(f"{args.background:,} background documents signed in {seeded:.1f} s", flush=True)
        costs, placed, _ = place_corpus(queue, documents, threshold, config.max_candidates)
        print(f"{len(documents):,} documents placed: {costs}", flush=True)
        quality = group_quality(queue, placed)
        print(f"groups: {quality}", flush=True)
        latency = search_latency(queue, placed, args.searches, folder)
        print(f"search: {latency}", flush=True)
        engine.dispose()
    print_result(
        {
            "documents": len(documents),
            "background_documents": args.background,
            "pages": args.pages,
            "words_per_page": args.words,
            "threshold": threshold,
            **costs,
            **quality,
            **latency,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
