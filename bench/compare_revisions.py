"""Run one benchmark of bench/ at two revisions, interleaved, and compare their RESULT figures.

    python bench/compare_revisions.py --base ee1a20d --rounds 3 -- queue_throughput.py --workers 4 --batches 50

The base revision is checked out into a temporary git worktree; each round runs the script once at the base and
once in this checkout (the order alternates between rounds, so neither side always runs on a warmer machine), with
this interpreter and the same arguments. A bench script puts its own checkout first on sys.path, so each side
imports its own code. These machines are shared and noisy: the figure to read is the median over rounds of the
per-round ratio current/base of each numeric figure. Ends with one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402


def _result(script: Path, args: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(
            f"{script} failed in {cwd} (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])


def _numbers(result: dict, prefix: str = "") -> dict[str, float]:
    found = {}
    for key, value in result.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            found[prefix + key] = float(value)
        elif isinstance(value, dict):
            found.update(_numbers(value, f"{prefix}{key}."))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the revision to compare against (a commit, tag or branch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...], a script in bench/")
    options = parser.parse_args()
    bench = options.bench[1:] if options.bench[:1] == ["--"] else options.bench
    if not bench:
        parser.error("name the benchmark script after --")
    script, args = bench[0], bench[1:]
    base_commit = subprocess.run(
        ["git", "rev-parse", "--short", options.base], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="docqueue-base-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), options.base], cwd=REPO, check=True, capture_output=True
        )
        try:
            rounds = []
            for number in range(options.rounds):
                sides = [("base", base), ("current", REPO)]
                if number % 2:
                    sides.reverse()
                results = {name: _numbers(_result(root / "bench" / script, args, root)) for name, root in sides}
                rounds.append(results)
                print(f"round {number + 1}: " + json.dumps(results), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    shared = sorted(set.intersection(*(set(r["base"]) & set(r["current"]) for r in rounds)))
    ratios = {
        key: statistics.median(r["current"][key] / r["base"][key] for r in rounds if r["base"][key])
        for key in shared
        if all(r["base"][key] for r in rounds)
    }
    for key, ratio in ratios.items():
        print(f"{key:60s} current/base {ratio:6.3f}")
    print_result(
        {
            "base": options.base,
            "base_commit": base_commit,
            "script": script,
            "rounds": options.rounds,
            "median_ratio_current_over_base": ratios,
        },
        sort_keys=True,
    )


if __name__ == "__main__":
    main()
