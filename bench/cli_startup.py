"""How long the light `docqueue` commands take from start to answer, each a new process, on the home the
environment names (DOCQUEUE_HOME; run `docqueue ingest` and `docqueue run --until-idle` on a few files first), and
the warm search session's latency on it. `ingest` registers a new small note each time (they stay in the home).

    .venv/bin/python bench/cli_startup.py [--repeats 5] [--searches 200] [--query "..."]

Medians of wall and CPU seconds per command (the database server already running), the session's opening and
its p50/p95 per search (embedding, both rankings, fusion), the load average; the last line is `RESULT {json}`.
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


def timed(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one `docqueue` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
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
    table = {**COMMANDS, "ingest": lambda: new_note(scratch), "search": ["search", query, "--json"]}
    figures = {}
    for name, args in table.items():
        runs = [timed(args() if callable(args) else args) for _ in range(repeats)]
        figures[name] = {
            "wall_s": round(statistics.median(w for w, _ in runs), 3),
            "cpu_s": round(statistics.median(c for _, c in runs), 3),
        }
        print(f"{name:8s} wall {figures[name]['wall_s']:.3f} s  cpu {figures[name]['cpu_s']:.3f} s", flush=True)
    return figures


def session(searches: int, query: str) -> dict[str, float]:
    from queue_db.config import Settings
    from resources.search_session import SearchSession

    started = time.perf_counter()
    with SearchSession(Settings.from_env()) as warm:
        opened = time.perf_counter() - started
        latencies = []
        for n in range(searches):
            began = time.perf_counter()
            warm.search(f"{query} {n % 7}", 5)
            latencies.append(time.perf_counter() - began)
    latencies.sort()
    figures = {
        "open_s": round(opened, 3),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p95_ms": round(1000 * latencies[int(len(latencies) * 0.95) - 1], 2),
        "searches": searches,
    }
    print(f"session  open {figures['open_s']:.3f} s  p50 {figures['p50_ms']} ms  p95 {figures['p95_ms']} ms")
    return figures


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
