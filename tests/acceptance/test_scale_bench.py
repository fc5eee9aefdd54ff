"""bench/scale.py end to end at tiny sizes: it seeds its own homes (embedded PostgreSQL, Qdrant Edge, Bolt,
Dagster's storage), measures every figure it does not skip, and ends with one `RESULT {json}` line whose figures
are numbers, one per N. The webserver page, the nightly run and the model run are left out here (their own tests
cover them); the full bench is run by hand (see docs/benchmarks.md, "scale.py")."""

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
    "run_worker": ("run_worker_peak_rss_mb", "run_worker_peak_anon_mb", "run_worker_s"),
}
AT_MAX = (
    "search_p95_ms_at_max",
    "partitions_page_s_at_max",
    "nightly_peak_rss_mb_at_max",
    "nightly_s_at_max",
    "status_s_at_max",
    "stats_s_at_max",
    "run_worker_peak_rss_mb_at_max",
)
PER_UNIT = {
    "claim_settle_tasks_per_s",
    "vector_write64_in_run_s",
    "search_p95_ms",
    "ranged_run_fixed_s",
    "sensor_tick_s",
    "recovery_s",
}
# an empty store has nothing to recall: the one figure reported as null, with its reason, at N = 0
NOT_MEASURED = {("search_recall_at_5", 0)}


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # a user's environment, not the test session's: each N gets its own embedded servers under --root
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCQUEUE_", "DAGSTER_HOME"))}
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "scale.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
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
        "400",
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
            else:
                assert isinstance(value, (int, float)) and value > 0, (name, n, value, missing.get(f"{name}@{n}"))
    assert set(result["ratios_at_max"]) == PER_UNIT
    assert all(isinstance(r, float) and r > 0 for r in result["ratios_at_max"].values()), result["ratios_at_max"]
    assert set(AT_MAX) <= set(result)
    assert result["status_s_at_max"] == figures["status_s"][-1] and result["stats_s_at_max"] == figures["stats_s"][-1]
    assert result["nightly_s_at_max"] is None  # skipped, not invented


def test_the_scale_bench_refuses_bad_sizes_in_one_sentence(tmp_path):
    done = _bench(tmp_path, "--sizes", "0,150")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--sizes and --pending: each N must be a non-negative multiple of 200" in done.stderr
