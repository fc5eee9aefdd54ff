"""How long the light `docqueue` commands take from start to answer, each a new process, on the home the
environment names (DOCQUEUE_HOME; run `docqueue ingest` and `docqueue run --until-idle` on a few files first), and
the warm search session's latency on it. `ingest` registers a new small note each time (they stay in the home).

    .venv/bin/python bench/cli_startup.py [--repeats 5] [--searches 200] [--query "..."]

Medians of wall and CPU seconds per command (the database server already running; `search_plain` is `search` with
DOCQUEUE_SEARCH_ENTITIES_PER_HIT=0, which never reads the graph, run in the same rounds), the session's opening and
its p50/p95 per search (embedding, both rankings, fusion, and the hits' entities from the graph), side by side with
the same searches without the graph (`plain`) and with the related entities of `--graph`, the load average; the
last line is `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"version": ["--version"], "help": ["--help"], "status": ["status", "--json"], "stats": ["stats", "--json"]}


# `search` as it runs by default, with each hit's entities, beside the same search that leaves the graph alone
SEARCH_ENV = {"search": {}, "search_plain": {"DOCQUEUE_SEARCH_ENTITIES_PER_HIT": "0"}}


def timed(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one `docqueue` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"docqueue {' '.join(args)} failed: {done.stderr.strip()}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def new_note(folder: Path) -> list[str]:
    """`ingest` of one new small Markdown file: new content each time, so every call registers a document."""
    note = folder / f"note-{time.monotonic_ns()}.md"
    note.write_text(f"# Startup note\n\nA note written at {time.time_ns()} to time one ingest.\n", encoding="utf-8")
    return ["ingest", str(note), "--json"]


def commands(repeats: int, query: str, scratch: Path) -> dict[str, dict[str, float]]:
    table = {
        **COMMANDS,
        "ingest": lambda: new_note(scratch),
        **{name: ["search", query, "--json"] for name in SEARCH_ENV},
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
    for _ in range(repeats):
        for name, args in table.items():  # a round of each, so the two searches see the same load
            runs[name].append(timed(args() if callable(args) else args, SEARCH_ENV.get(name)))
    figures = {}
    for name in table:
        figures[name] = {
            "wall_s": round(statistics.median(w for w, _ in runs[name]), 3),
            "cpu_s": round(statistics.median(c for _, c in runs[name]), 3),
        }
        print(f"{name:12s} wall {figures[name]['wall_s']:.3f} s  cpu {figures[name]['cpu_s']:.3f} s", flush=True)
    return figures


# the warm search's variants, measured side by side: without the graph, with each hit's entities (the default),
# and with the related entities of `docqueue search --graph`
VARIANTS = {"plain": {"entities": False}, "entities": {}, "graph": {"graph": True}}


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 2),
        "p95_ms": round(1000 * ordered[max(int(len(ordered) * 0.95) - 1, 0)], 2),
    }


def session(searches: int, query: str) -> dict:
    from queue_db.config import Settings
    from resources.search_session import SearchSession

    started = time.perf_counter()
    with SearchSession(Settings.from_env()) as warm:
        opened = time.perf_counter() - started
        latencies: dict[str, list[float]] = {name: [] for name in VARIANTS}
        reads: dict[str, list[float]] = {"entities": [], "graph": []}
        read_of = timed_reads(warm, reads)
        entities = 0
        for n in range(searches):
            # each round runs every variant on the same query, in a rotating order, so none always goes first
            names = list(VARIANTS)
            for name in names[n % len(names) :] + names[: n % len(names)]:
                read_of[0] = name
                began = time.perf_counter()
                found = warm.search(f"{query} {n % 7}", 5, **VARIANTS[name])
                latencies[name].append(time.perf_counter() - began)
                entities += sum(len(hit.entities) for hit in found.hits) if name == "entities" else 0
    variants = {name: percentiles(values) for name, values in latencies.items()}
    graph_reads = {name: percentiles(values) for name, values in reads.items() if values}
    figures = {
        "open_s": round(opened, 3),
        **variants["entities"],
        "searches": searches,
        **{name: variants[name] for name in ("plain", "graph")},
        "entities_added_p95_ms": round(variants["entities"]["p95_ms"] - variants["plain"]["p95_ms"], 2),
        "entities_per_search": round(entities / max(searches, 1), 1),
        "graph_read": graph_reads,
    }
    print(f"session  open {figures['open_s']:.3f} s", flush=True)
    for name, values in variants.items():
        print(f"  {name:8s} p50 {values['p50_ms']} ms  p95 {values['p95_ms']} ms", flush=True)
    for name, values in graph_reads.items():
        print(f"  graph read ({name}) p50 {values['p50_ms']} ms  p95 {values['p95_ms']} ms", flush=True)
    return figures


def timed_reads(warm, reads: dict[str, list[float]]) -> list[str]:
    """Times the session's graph reads alone, into `reads` under the variant the returned cell names: the part of
    a search the entities add, apart from the embedding and the rankings, whose spread hides it on a busy machine."""
    lookup, variant = warm.graph.lookup, [""]

    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return lookup(*args, **kwargs)
        finally:
            reads[variant[0]].append(time.perf_counter() - began)

    warm.graph.lookup = timed
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--query", default="storm damage at the harbour")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from bench._result import print_result

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as scratch:
        figures = commands(args.repeats, args.query, Path(scratch))
    print_result(
        {
            "commands": figures,
            "session": session(args.searches, args.query),
            "repeats": args.repeats,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        }
    )


if __name__ == "__main__":
    main()
