"""bench/scale.py end to end at tiny sizes: it seeds its own homes (embedded PostgreSQL, Qdrant Edge, Bolt,
Dagster's storage), measures every figure it does not skip, and ends with one `RESULT {json}` line whose figures
are numbers, one per N. The webserver page and the nightly run are left out here (their own tests cover them); the
real run is in, on a 3-page document, and must have written its points, Chunk nodes and mentions. The full bench is
run by hand (see docs/benchmarks.md, "scale.py")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIZES = [0, 2000]
SKIPPED = {
    "partitions_page": ("partitions_page_s",),
    "nightly": ("nightly_s", "nightly_peak_rss_mb", "nightly_peak_anon_mb", "nightly_capped"),
}
AT_MAX = (
    "search_p95_ms_at_max",
    "partitions_page_s_at_max",
    "nightly_peak_rss_mb_at_max",
    "nightly_s_at_max",
    "status_s_at_max",
    "stats_s_at_max",
    "real_run_peak_rss_mb_at_max",
    "search_session_p95_ms_at_max",
    "search_cli_s_at_max",
    "search_full_tail_p95_ms_at_max",
    "recovery_index_peak_rss_mb_at_max",
)
PER_UNIT = {
    "claim_settle_tasks_per_s",
    "vector_write64_in_run_s",
    "search_p50_ms",
    "search_p95_ms",
    "search_session_p50_ms",
    "search_session_p95_ms",
    "search_session_tenant_p95_ms",
    "search_cli_s",
    "search_full_tail_p95_ms",
    "ranged_run_fixed_s",
    "sensor_tick_s",
    "recovery_release_per_task_ms",
    "recovery_retire_per_partition_ms",
    "recovery_index_per_point_ms",
    "checks_per_chunk_us",
    "real_run_per_chunk_s",
    "real_run_fixed_s",
}
# the difference of two runs' times over the difference of their chunks: at 4 and 12 chunks, noise can make it
# zero or negative (a number all the same)
DIFFERENCE = "real_run_per_chunk_s"
# an empty store has nothing to recall: the one figure reported as null, with its reason, at N = 0
NOT_MEASURED = {("search_recall_at_5", 0)}
# nor anything to find: the warm session's hits at N = 0
NOTHING_FOUND = {("search_session_hits", 0)}


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # a user's environment, not the test session's: each N gets its own embedded servers under --root
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCQUEUE_", "DAGSTER_HOME"))}
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), *args],
        capture_output=True,
        text=True,
        timeout=660,
        env=env,
        cwd=tmp_path,
    )


def test_the_scale_bench_reports_each_figure_at_each_size(tmp_path):
    done = _bench(
        tmp_path,
        "--sizes",
        ",".join(map(str, SIZES)),
        "--quick",
        "--skip",
        ",".join(SKIPPED),
        "--deadline",
        "560",
        "--root",
        str(tmp_path / "homes"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.rstrip().splitlines()[-1]
    assert last.startswith("RESULT ") and sum(line.startswith("RESULT ") for line in done.stdout.splitlines()) == 1
    result = json.loads(last[len("RESULT ") :])

    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", result["commit"]), result["commit"]
    assert result["n"] == SIZES
    figures, missing = result["figures"], result["missing"]
    skipped = {key for keys in SKIPPED.values() for key in keys}
    for name, values in figures.items():
        assert len(values) == len(SIZES), name
        for n, value in zip(SIZES, values):
            if name in skipped:
                assert value is None and missing[f"{name}@{n}"] == "skipped (--skip)"
            elif (name, n) in NOT_MEASURED:
                assert value is None and missing[f"{name}@{n}"].startswith("not measured")
            elif (name, n) in NOTHING_FOUND:
                assert value == 0, (name, n, value)
            elif name == DIFFERENCE:
                assert isinstance(value, (int, float)), (name, n, value, missing.get(f"{name}@{n}"))
            else:
                assert isinstance(value, (int, float)) and value > 0, (name, n, value, missing.get(f"{name}@{n}"))
    # the real run wrote its document whole: a point per chunk id, a Chunk node per chunk, mentions in the graph
    for n, chunks, points, nodes, mentions in zip(
        SIZES,
        figures["real_run_chunks"],
        figures["real_run_points"],
        figures["real_run_nodes"],
        figures["real_run_mentions"],
    ):
        assert chunks > 4 and points == chunks and nodes == chunks and mentions > 0, (n, chunks, points, nodes)
    # every recovery step had work and did it
    assert all(v >= 500 for v in figures["recovery_released"]), figures["recovery_released"]
    assert all(v > 0 for v in figures["recovery_retired"] + figures["recovery_indexed"]), figures
    assert result["homes"] == ["fresh", "fresh"]
    for before, after in result["load_per_n"]:
        assert len(before) == len(after) == 3
    assert set(result["ratios"]) == set(result["ratios_at_max"]) == PER_UNIT
    for name, ratios in result["ratios"].items():
        assert len(ratios) == len(SIZES) and ratios[0] in (1.0, None), (name, ratios)
        assert ratios[-1] == result["ratios_at_max"][name]
        if name != DIFFERENCE:
            assert all(isinstance(r, float) and r > 0 for r in ratios), (name, ratios)
    # 100,000 not run
    assert result["search_ratios_vs_100000"] == dict.fromkeys(
        ("search_p50_ms", "search_p95_ms", "search_session_p95_ms", "search_cli_s")
    )
    # the warm session found hits in the seeded home, and the index build was sampled
    assert figures["search_session_hits"][-1] > 0
    assert all(
        peak >= before > 0
        for before, peak in zip(figures["recovery_index_rss_before_mb"], figures["recovery_index_peak_rss_mb"])
    ), figures
    assert set(AT_MAX) <= set(result)
    assert result["status_s_at_max"] == figures["status_s"][-1] and result["stats_s_at_max"] == figures["stats_s"][-1]
    assert result["nightly_s_at_max"] is None  # skipped, not invented


def test_the_scale_bench_refuses_bad_sizes_in_one_sentence(tmp_path):
    done = _bench(tmp_path, "--sizes", "0,150")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--sizes and --pending: each N must be a non-negative multiple of 200" in done.stderr
