"""Every script of bench/ runs as a user runs it, at a tiny size, so a bench that no longer runs fails the suite
rather than the next person who measures with it. Each must exit 0 and end with one line `RESULT {json}` holding
the commit it measured. The figures of a tiny run mean nothing and are not checked; the full runs are by hand
(docs/benchmarks.md). A new bench needs a row in SMOKE_ARGS, or in COVERED_ELSEWHERE with the test that runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pdf_factory as pf

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
TIMEOUT_S = 600  # scale_out took 100 s at a load of 5 on 2 cores
COMMIT = re.compile(r"[0-9a-f]{7,40}(-dirty)?")

# the tiniest run each bench's arguments allow: {admin_url} is the session's PostgreSQL (the benches create and drop
# databases of their own on it), {corpus} a folder of generated PDFs in place of ../shared/corpus
SMOKE_ARGS: dict[str, list[str]] = {
    "chunk_dedup": ["--admin-url", "{admin_url}", "--corpus", "{corpus}"],
    # one set, one generated text page: its own home, run and stage pass, as every set takes them; a second set
    # would only repeat them (~37 s a set)
    "cores_limit": ["--sets", "text", "--text-pages", "1", "--pages-per-document", "1"],
    # the cheapest bench (no server, no model) against this checkout's HEAD, one round
    "compare_revisions": [
        "--base",
        "HEAD",
        "--rounds",
        "1",
        "--",
        "tenant_search.py",
        "--points",
        "200",
        "--searches",
        "3",
    ],
    "dagster_storage": ["--keys", "5", "--admin-url", "{admin_url}"],
    "entity_resolution": ["--corpus", "{corpus}", "--examples", "1"],
    # rows 1 and 2 run in tests/reliability/test_database_faults.py; the script's own run: row 3, its own server
    "faults": ["--quick", "--rows", "3", "--no-clean", "--tasks", "3000", "--vacuum-timeout-s", "0"],
    "near_duplicates": ["--families", "3", "--background", "100", "--searches", "3", "--admin-url", "{admin_url}"],
    "orchestration_overhead": ["--documents", "1", "--pages", "1", "--admin-url", "{admin_url}"],
    # 1,000 live keys is the least the bench allows (one ranged run's keys); 1,000 more to retire
    "partition_retention": ["--n", "2000", "--live", "1000", "--repeats", "1", "--admin-url", "{admin_url}"],
    # PgQueuer is the bench extra's, not the test extra's: the contenders that need nothing more
    "queue_throughput": [
        "--quick",
        "--workers",
        "2",
        "--batches",
        "50",
        "--tasks",
        "100",
        "--window",
        "0.5",
        "--contenders",
        "ours,ours_settle,bare",
    ],
    # its own Redis (redis-server, as the cluster test starts it), PostgreSQL and Celery workers, three variants;
    # the workers in network namespaces where this host can make them
    "scale_out": ["--documents", "1", "--pages", "1", "--runs-per-worker", "1"],
    "run_launch": ["--runs", "1", "--rounds", "1", "--admin-url", "{admin_url}"],
    "stages": ["--text-pages", "1", "--scanned-pages", "1"],
    "tenant_search": ["--points", "200", "--searches", "3"],
    "vector_store": ["--sizes", "0,200", "--writes", "1", "--searches", "3"],
    "verify_memory": ["--n", "1000", "--admin-url", "{admin_url}"],
}
# queue_throughput takes its server from the environment only
SMOKE_ENV: dict[str, dict[str, str]] = {"queue_throughput": {"DOCQUEUE_BENCH_PG_ADMIN_URL": "{admin_url}"}}
# benches another test runs, and that test; test_retrieval.py runs retrieval.py's evaluation in-process, its
# command line aside (a run of the script on one page takes 45 s more: its own servers and pipeline run)
COVERED_ELSEWHERE = {
    "scale": "tests/acceptance/test_scale_bench.py",
    "retrieval": "tests/acceptance/test_retrieval.py",
    "cli_startup": "tests/acceptance/test_cli_startup_bench.py",
}


def _corpus(folder: Path) -> Path:
    """One text PDF of three pages, as the corpus's MANIFEST lists it: chunk_dedup's second version leaves two of
    them unchanged (copies to reuse), and the names give entity resolution a short form to resolve."""
    folder.mkdir()
    pf.text_pdf(
        folder,
        "railway.pdf",
        [
            [
                "# Northern Railway",
                "Anna Keller directs the Northern Railway Company in Geneva. Keller presented the "
                "new timetable to the committee of the company.",
            ],
            [
                "## Routes",
                "Passenger numbers between Zurich and Milan rose by twelve percent, while the freight "
                "volumes to Rotterdam remained stable over the whole year.",
            ],
            [
                "## Outlook",
                "The committee in Geneva approved hourly trains between Zurich and Milan from the spring, "
                "and the board thanked the staff of the stations along the line.",
            ],
        ],
    )
    (folder / "MANIFEST.tsv").write_text("filename\tcategory\nrailway.pdf\ttext\n")
    return folder


def _filled(texts, values: dict[str, str]):
    for text in texts:
        for name, value in values.items():
            text = text.replace("{" + name + "}", value)
        yield text


@pytest.mark.parametrize("bench", sorted(SMOKE_ARGS))
def test_the_bench_runs_at_a_tiny_size(bench, pg_admin_url, tmp_path):
    values = {"admin_url": pg_admin_url}
    if any("{corpus}" in arg for arg in SMOKE_ARGS[bench]):
        values["corpus"] = str(_corpus(tmp_path / "corpus"))
    # a user's environment, not the test session's: no DOCQUEUE_* setting, no DAGSTER_HOME
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCQUEUE_", "DAGSTER_HOME"))}
    extra = SMOKE_ENV.get(bench, {})
    env.update(zip(extra, _filled(extra.values(), values)))
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{bench}.py"), *_filled(SMOKE_ARGS[bench], values)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    output = f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output
    lines = done.stdout.rstrip().splitlines()
    assert lines and lines[-1].startswith("RESULT "), output
    assert sum(line.startswith("RESULT ") for line in lines) == 1, output
    result = json.loads(lines[-1][len("RESULT ") :])
    assert isinstance(result, dict) and COMMIT.fullmatch(result.get("commit") or ""), result


def test_every_bench_has_a_smoke_test():
    # a module whose name starts with an underscore is shared by the benches, not run on its own
    benches = {path.stem for path in BENCH.glob("*.py") if not path.stem.startswith("_")}
    assert not SMOKE_ARGS.keys() & COVERED_ELSEWHERE.keys()
    missing = benches - SMOKE_ARGS.keys() - COVERED_ELSEWHERE.keys()
    assert not missing, f"bench scripts without a smoke test (add them to SMOKE_ARGS): {sorted(missing)}"
    assert not (SMOKE_ARGS.keys() | COVERED_ELSEWHERE.keys()) - benches, "a row names a bench that is gone"
    for bench, test_file in COVERED_ELSEWHERE.items():
        assert f'"{bench}.py"' in (REPO / test_file).read_text(), f"{test_file} does not run bench/{bench}.py"
