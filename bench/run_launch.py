"""A run's start: what the daemon's machine spends on each run it launches, Dagster's way against docqueue's launcher.

  spawn       every run in a new interpreter that imports the code location and builds its repository, as Dagster's
              code server starts the process of each run it is asked for (multiprocessing's spawn; the gRPC round
              trip to the code server is left out, so this arm costs, if anything, less than Dagster's own launcher);
  forkserver  docqueue's launcher as dagster.yaml configures it (orchestration/run_launcher.py): every run forked
              from a template process that loaded both once.

Both launch the same runs of `recovery_job` (the recovery sensor's run, unpartitioned, with little work, so its start
is most of it) one at a time through orchestration.run_launcher.ForkedRunLauncher against a real instance and queue
database, the two arms alternating each round. Per run: the CPU seconds of the run's process, from its exit event
(counted from the fork, or from the interpreter's start when spawned), and the wall time from the launch to the
run's end. The template process's own start (once per daemon) is timed apart.

  .venv/bin/python bench/run_launch.py [--runs 5] [--rounds 3] [--admin-url URL]

Ends with one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._pipeline_env import migrated_queue, pipeline_env  # noqa: E402
from bench._result import print_result  # noqa: E402
from bench.orchestration_overhead import _median, services  # noqa: E402

ARMS = ("spawn", "forkserver")
EXIT_EVENT = re.compile(r"Process for run exited \(pid: \d+, ([0-9.]+) CPU s[,)]")


def launch_one(instance, launcher, job) -> dict:
    import dagster as dg
    from dagster._core.launcher.base import LaunchRunContext

    run = instance.create_run_for_job(
        job_def=job.get_definition(), job_code_origin=job.get_python_origin(), status=dg.DagsterRunStatus.NOT_STARTED
    )
    started = time.perf_counter()
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    while not instance.get_run_by_id(run.run_id).is_finished:
        time.sleep(0.05)
    wall = time.perf_counter() - started
    status = instance.get_run_by_id(run.run_id).status
    if status != dg.DagsterRunStatus.SUCCESS:
        raise SystemExit(f"run {run.run_id} ended {status.value}")
    deadline = time.monotonic() + 60
    while True:  # the process writes its exit event after the run's end
        cpu = [float(m.group(1)) for e in instance.all_logs(run.run_id) if (m := EXIT_EVENT.search(e.message or ""))]
        if cpu or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not cpu:
        raise SystemExit(f"run {run.run_id}'s process wrote no exit event")
    return {"wall_s": wall, "cpu_s": cpu[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--admin-url", default=None)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="docqueue-bench-launch-"))
    with services(root, args.admin_url) as (bolt, databases):
        home = root / "home"
        os.environ.update(pipeline_env(home, migrated_queue(databases, "queue"), databases.create("dagster"), bolt))
        from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository

        from orchestration.environment import dagster_instance
        from orchestration.run_launcher import ForkedRunLauncher
        from queue_db.config import Settings

        instance = dagster_instance(Settings.from_env())
        job = ReconstructableJob(
            ReconstructableRepository.for_module("orchestration.definitions", "defs", working_directory=str(REPO)),
            "recovery_job",
        )
        launchers = {arm: ForkedRunLauncher(start_method=arm) for arm in ARMS}
        for launcher in launchers.values():
            launcher.register_instance(instance)
        # the first forked run starts the template too: once per daemon
        template_s = launch_one(instance, launchers["forkserver"], job)["wall_s"]
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for round_ in range(args.rounds):
            for arm in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                runs[arm] += [launch_one(instance, launchers[arm], job) for _ in range(args.runs)]
                print(
                    f"round {round_ + 1} {arm:10s}: " + ", ".join(f"{r['cpu_s']:.2f}" for r in runs[arm][-args.runs :])
                )
        instance.dispose()

    figures = {
        arm: {
            "cpu_s_per_run": round(_median([r["cpu_s"] for r in runs[arm]]), 3),
            "wall_s_per_run": round(_median([r["wall_s"] for r in runs[arm]]), 3),
        }
        for arm in ARMS
    }
    cpu_ratio = figures["spawn"]["cpu_s_per_run"] / max(figures["forkserver"]["cpu_s_per_run"], 1e-3)
    wall_ratio = figures["spawn"]["wall_s_per_run"] / max(figures["forkserver"]["wall_s_per_run"], 1e-3)
    for arm in ARMS:
        print(f"{arm:10s}: {figures[arm]['cpu_s_per_run']:.3f} CPU s, {figures[arm]['wall_s_per_run']:.3f} s a run")
    print(
        f"spawn / forkserver: CPU {cpu_ratio:.1f}x, wall {wall_ratio:.1f}x; the template's first run {template_s:.1f} s"
    )
    print_result(
        {
            "runs_per_arm": len(runs["spawn"]),
            "job": "recovery_job",
            **figures,
            "cpu_ratio_spawn_forkserver": round(cpu_ratio, 2),
            "wall_ratio_spawn_forkserver": round(wall_ratio, 2),
            "template_first_run_s": round(template_s, 2),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
    )


if __name__ == "__main__":
    main()
