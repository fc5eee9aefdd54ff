"""bench/scale.py's searches through the paths users take, and the seeded texts they search: `docqueue search` in a
new process (cold), the warm search session (resources/search_session.SearchSession) with and without a tenant
filter, the same session while a full vector tail waits for its index, and one index build of that tail in a
process of its own, sampled for memory. Not a bench of its own (the smoke test leaves out modules whose names
start with an underscore).

The seeded chunks carry texts of made-up words drawn as word frequencies fall in prose, and a tenant each, so
that the keyword half of the hybrid search and the tenant filter do the work they do on a real corpus. The
queries are made of the same words; their embeddings come from the real model, so the dense half searches the
seeded vectors with vectors unlike theirs: what it costs does not depend on that, what it finds does (recall is
measured on the private dense call of measure_search, against exact search)."""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# real chunks hold about 200 words (processing/sparse.AVERAGE_LENGTH); 60 keep the seeding of a million within
# minutes, so the keyword postings are shorter than a real corpus's
VOCABULARY, CHUNK_WORDS, QUERY_WORDS = 30_000, 60, 4
TENANT, TENANT_EVERY = "acme", 10  # a tenant holding a tenth of the documents, for the filtered searches
CLI_SEARCHES = 5


@functools.cache
def vocabulary() -> list[str]:
    """VOCABULARY made-up words of two to four syllables, the same in every process."""
    import numpy as np

    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: dict[str, None] = {}
    rng = np.random.default_rng(1)
    while len(words) < VOCABULARY:
        words["".join(syllables[i] for i in rng.integers(0, len(syllables), rng.integers(2, 5)))] = None
    return list(words)


def zipf_words(rng, rows: int, width: int, skip: int = 0):
    """`rows` x `width` word ranks drawn as word frequencies fall in prose (rank r has weight 1 / (r + 2.7),
    Mandelbrot's form of Zipf's law); `skip` leaves out the most common ranks."""
    import numpy as np

    ranks = np.arange(skip, VOCABULARY)
    weights = 1.0 / (ranks + 2.7)
    return rng.choice(ranks, size=(rows, width), p=weights / weights.sum())


def chunk_texts(rng, n: int) -> list[str]:
    words = vocabulary()
    return [" ".join(words[r] for r in row) for row in zipf_words(rng, n, CHUNK_WORDS)]


def query_texts(rng, n: int) -> list[str]:
    """Queries of QUERY_WORDS words, the 50 most common left out, as a user's content words are."""
    words = vocabulary()
    return [" ".join(words[r] for r in row) for row in zipf_words(rng, n, QUERY_WORDS, skip=50)]


def _percentiles(timings: list[float]) -> tuple[float, float]:
    timings = sorted(timings)
    return timings[len(timings) // 2], timings[min(len(timings) - 1, int(len(timings) * 0.95))]


def measure_session(settings, rng, searches: int, *, tenant: bool = True) -> tuple:
    """The warm search session as an application keeps it: one SearchSession, a first search to load the model
    and open the stores, then `searches` hybrid searches of 5 hits (the query's embedding, both rankings, their
    fusion, the collapse of copies and the entities from the graph: everything `docqueue search` does after its
    start-up), p50 and p95 in ms; with `tenant`, as many again filtered to TENANT's tenth of the documents.
    Returns (p50, p95, tenant p50, tenant p95, hits found in all)."""
    from resources.search_session import SearchSession

    queries = query_texts(rng, searches)
    found = 0
    with SearchSession(settings) as session:
        session.search(queries[0])
        rounds = [(None, [])] + ([(TENANT, [])] if tenant else [])
        for name, timings in rounds:
            for query in queries:
                started = time.perf_counter()
                result = session.search(query, limit=5, tenant=name)
                timings.append((time.perf_counter() - started) * 1000)
                found += len(result.hits)
    p50, p95 = _percentiles(rounds[0][1])
    t50, t95 = _percentiles(rounds[1][1]) if tenant else (None, None)
    return p50, p95, t50, t95, found


def measure_cli(rng, expect_hits: bool) -> tuple[float, float, float]:
    """`docqueue search QUERY --json` in a new process, as a user types it: start-up, the model's loading, the
    stores' opening and one hybrid search; the median of CLI_SEARCHES queries, then one with `--tenant TENANT`.
    With `expect_hits` (a seeded store) each must answer with hits. Returns (median seconds, the tenant's, the
    first query's)."""

    def once(query: str, *extra: str) -> float:
        started = time.perf_counter()
        done = subprocess.run(
            [str(BIN / "docqueue"), "search", query, "--json", *extra], capture_output=True, text=True, timeout=600
        )
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"docqueue search exited {done.returncode}: {done.stderr.strip()[:300]}")
        if expect_hits and not json.loads(done.stdout)["hits"]:
            raise RuntimeError(f"docqueue search {query!r} found nothing in a seeded home")
        return elapsed

    queries = query_texts(rng, CLI_SEARCHES + 1)
    timings = [once(q) for q in queries[:CLI_SEARCHES]]
    return statistics.median(timings), once(queries[-1], "--tenant", TENANT), timings[0]


INDEX_CHILD = """
import json, sys, time
import psutil
sys.path.insert(0, {repo!r})
from orchestration.maintenance import index_vector_tail
from queue_db.config import Settings
from resources.vector_resource import QdrantResource
qdrant = QdrantResource.from_settings(Settings.from_env())
before = psutil.Process().memory_info().rss
started = time.perf_counter()
indexed = index_vector_tail(qdrant, {model!r}, {tail})
print(json.dumps({{"s": time.perf_counter() - started, "rss_before_mb": before / 2**20, **indexed}}))
"""


def measure_index_build(model: str, tail: int, timeout_s: float) -> dict:
    """The recovery job's tail step (orchestration.maintenance.index_vector_tail) in a process of its own, sampled
    from outside every 0.2 s (the build holds the GIL, so a thread inside would miss its peak): its seconds, what it
    found waiting, whether it built, its RSS before the build (the interpreter and imports) and its peak RSS and
    anonymous memory in MB."""
    from bench._scale_work import _sampled

    done, peak_rss, peak_anon = _sampled(
        [sys.executable, "-c", INDEX_CHILD.format(repo=str(REPO), model=model, tail=tail)], timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"the tail's index build exited {done.returncode}: {done.stderr.strip()[-300:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {**figures, "peak_rss_mb": peak_rss / 2**20, "peak_anon_mb": peak_anon / 2**20}
