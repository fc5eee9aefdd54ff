"""bench/cli_startup.py end to end at the smallest size: on a home with one processed document it times each light
command once, beside the same commands at the checkout's own commit (`--before HEAD`, extracted from git), and a few
warm searches (bare, reading no groups and no graph; without the graph; with the hits' entities; with --graph), and
ends with one `RESULT {json}` line whose figures are numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_startup_bench_reports_every_figure(docqueue_env, tmp_path):
    note = tmp_path / "note.md"
    note.write_text("# Harbour\n\nStorm damage at the harbour: two boats sank and the pier lost its lights.\n")
    for args in (["ingest", str(note)], ["run", "--until-idle"]):
        done = subprocess.run(
            [sys.executable, "-m", "orchestration.cli", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=os.environ.copy(),
        )
        assert done.returncode == 0, done.stderr
    bench = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "cli_startup.py"),
            "--repeats",
            "1",
            "--searches",
            "5",
            "--before",
            "HEAD",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert bench.returncode == 0, bench.stderr
    last = bench.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), bench.stdout
    result = json.loads(last[len("RESULT ") :])
    assert set(result["commands"]) == {"version", "help", "status", "stats", "ingest", "search", "search_plain"}
    assert all(isinstance(v, float) for figures in result["commands"].values() for v in figures.values())
    # the same commands with the code of --before's revision, and after / before per command
    assert set(result["before"]) == set(result["commands"]) == set(result["ratio_after_over_before"])
    assert all(figures["cpu_s"] > 0 for figures in result["before"].values()) and result["before_commit"]
    assert result["session"]["p95_ms"] > 0 and result["session"]["searches"] == 5 and result["commit"]
    # the same searches without the graph and with --graph's related entities, side by side
    assert all(result["session"][variant]["p95_ms"] > 0 for variant in ("bare", "plain", "graph"))
    assert isinstance(result["session"]["entities_added_p95_ms"], float)
    # what groups and entities add, against searches that read no group: the bare ones made no look-up
    assert isinstance(result["session"]["groups_and_entities_added_p95_ms"], float)
    assert result["session"]["group_reads"]["bare"] == 0 and result["session"]["group_reads"]["entities"] >= 5
    assert set(result["session"]["graph_read"]) == {"entities", "graph"}
