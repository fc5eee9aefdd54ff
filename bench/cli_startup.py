"""How long the light `docqueue` commands take from start to answer, each a new process, on the home the
environment names (DOCQUEUE_HOME; run `docqueue ingest` and `docqueue run --until-idle` on a few files first), and
the warm search session's latency on it. `ingest` registers a new small note each time (they stay in the home).

    .venv/bin/python bench/cli_startup.py [--repeats 5] [--searches 200] [--query "..."] [--before REF]

Medians of wall and CPU seconds per command (the database server already running; `search_plain` is `search` with
DOCQUEUE_SEARCH_ENTITIES_PER_HIT=0, which never reads the graph, run in the same rounds), the session's opening and
its p50/p95 per search (embedding, both rankings, fusion, the content groups and the hits' entities from the graph),
side by side with the same searches without the graph (`plain`), with neither groups nor graph (`bare`) and with the
related entities of `--graph`, the load average; the
last line is `RESULT {json}`. `--before REF` times the same commands with the code of git revision REF too (a
copy extracted to a scratch folder, run against the same home), in the same rounds, alternating which goes first,
and reports its figures under `before` and the ratios after/before. The commands run from their bytecode caches
(written in an untimed first round), PYTHONDONTWRITEBYTECODE or not.
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


# the commands run from their bytecode caches, as an installed docqueue does after its first run: with
# PYTHONDONTWRITEBYTECODE set (some shells and containers set it) every process would compile the project's
# modules again, some 50 ms of each light command that no user pays
CHILD_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def timed(args: list[str], env: dict[str, str] | None = None, code: Path = REPO_ROOT) -> tuple[float, float]:
    """Wall and CPU seconds of one `docqueue` process running the checkout at `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        capture_output=True,
        text=True,
        cwd=code,
        env={**CHILD_ENV, "PYTHONPATH": str(code), **(env or {})},
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


def commands(repeats: int, query: str, scratch: Path, codes: dict[str, Path]) -> dict[str, dict]:
    """Per checkout in `codes` (name: folder), per command, the medians of wall and CPU seconds."""
    table = {
        **COMMANDS,
        "ingest": lambda: new_note(scratch),
        **{name: ["search", query, "--json"] for name in SEARCH_ENV},
    }
    for code in codes.values():  # one untimed round each: the checkouts' bytecode caches are written before timing
        for name, args in table.items():
            timed(args() if callable(args) else args, SEARCH_ENV.get(name), code)
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {side: {name: [] for name in table} for side in codes}
    for round_ in range(repeats):
        for name, args in table.items():  # a round of each, so the two searches see the same load
            # the checkouts side by side, each command of one right after the other's, the first one alternating
            sides = list(codes) if round_ % 2 == 0 else list(reversed(codes))
            for side in sides:
                runs[side][name].append(timed(args() if callable(args) else args, SEARCH_ENV.get(name), codes[side]))
    figures: dict[str, dict] = {}
    for side in codes:
        figures[side] = {}
        for name in table:
            figures[side][name] = {
                "wall_s": round(statistics.median(w for w, _ in runs[side][name]), 3),
                "cpu_s": round(statistics.median(c for _, c in runs[side][name]), 3),
            }
            shown = figures[side][name]
            label = f"{name} ({side})" if len(codes) > 1 else name
            print(f"{label:21s} wall {shown['wall_s']:.3f} s  cpu {shown['cpu_s']:.3f} s", flush=True)
    return figures


def ratios(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """after / before, per command and figure."""
    return {
        name: {key: round(value / before[name][key], 2) if before[name][key] else 0.0 for key, value in shown.items()}
        for name, shown in after.items()
    }


def extracted(ref: str, folder: Path) -> str:
    """The files of git revision `ref` written under `folder`; its short commit hash."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", resolved], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return resolved


# the warm search's variants, measured side by side: `bare` without what issue 27 adds (no content groups read,
# no copies collapsed, no graph), without the graph, with each hit's entities (the default: groups and entities),
# and with the related entities of `docqueue search --graph`
VARIANTS = {
    "bare": {"entities": False, "all_copies": True},
    "plain": {"entities": False},
    "entities": {},
    "graph": {"graph": True},
}


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
        group_reads = without_groups(read_of)
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
        # what content groups and entities add together to a default search, in the same rounds
        "groups_and_entities_added_p95_ms": round(variants["entities"]["p95_ms"] - variants["bare"]["p95_ms"], 2),
        "bare": variants["bare"],
        "group_reads": group_reads,
        "entities_per_search": round(entities / max(searches, 1), 1),
        "graph_read": graph_reads,
    }
    print(f"session  open {figures['open_s']:.3f} s", flush=True)
    for name, values in variants.items():
        print(f"  {name:8s} p50 {values['p50_ms']} ms  p95 {values['p95_ms']} ms", flush=True)
    for name, values in graph_reads.items():
        print(f"  graph read ({name}) p50 {values['p50_ms']} ms  p95 {values['p95_ms']} ms", flush=True)
    print(f"  groups and entities add {figures['groups_and_entities_added_p95_ms']} ms p95", flush=True)
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


def without_groups(variant: list[str]) -> dict[str, int]:
    """The `bare` variant reads no content groups: the session's group look-up answers "no groups" at once while
    the cell `variant` names it, so `bare` is a search as it was before groups existed (with `all_copies`, no
    over-fetch and no collapse). Returns the count of group look-ups made per variant."""
    import resources.search_copies as copies

    lookup, made = copies.copies_of, dict.fromkeys(VARIANTS, 0)

    def copies_of(*args, **kwargs):
        if variant[0] == "bare":
            return {}
        made[variant[0]] += 1
        return lookup(*args, **kwargs)

    copies.copies_of = copies_of
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--query", default="storm damage at the harbour")
    parser.add_argument("--before", metavar="REF", help="also time the commands at git revision REF, side by side")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from bench._result import print_result

    load_before = os.getloadavg()[0]
    compared: dict = {}
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as scratch:
        codes = {"after": REPO_ROOT}
        if args.before:
            (Path(scratch) / "before").mkdir()
            compared["before_commit"] = extracted(args.before, Path(scratch) / "before")
            codes["before"] = Path(scratch) / "before"
        (Path(scratch) / "notes").mkdir()
        figures = commands(args.repeats, args.query, Path(scratch) / "notes", codes)
    if args.before:
        compared["before"] = figures["before"]
        compared["ratio_after_over_before"] = ratios(figures["after"], figures["before"])
    print_result(
        {
            "commands": figures["after"],
            **compared,
            "session": session(args.searches, args.query),
            "repeats": args.repeats,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        }
    )


if __name__ == "__main__":
    main()
