"""Scale-out: the same CPU-bound corpus (generated text pages, no OCR) processed three ways, each on fresh databases:

  inproc-1   the Dagster path in one process (`docqueue run` semantics: ranged runs executed in-process), that
             process pinned to one core;
  celery-1   the cluster path: ranged runs through Dagster's Celery executor (DOCQUEUE_EXECUTOR=celery) on a
             private Redis broker, one `docqueue worker --concurrency 1` pinned to one core, in a network namespace
             of its own that reaches the broker, PostgreSQL and the Bolt server over a veth pair, as a worker
             machine does (tests/network_hosts.py; `--hosts loopback`, or a host that cannot make namespaces,
             keeps them on loopback);
  celery-2   the same with two workers, each pinned to a core of its own.

The Celery variants keep --runs-per-worker runs in flight per worker (2): while a worker runs one step, the next
run's step already waits on the broker, so the worker never idles while the run it just finished is recorded and the
next one is created (set the pools' limits the same way in a deployment: README, "Run limits across the cluster").
--scanned makes every page a picture without a text layer, so every page goes through OCR.

Every worker runs its models with one thread (OMP_NUM_THREADS=1 and friends), so a worker is one core's worth of
work. The driver that plans and launches the runs (what the daemon does in a deployment) is not pinned: in the
Celery variants it plans as the sensors do and launches each run through the instance's run launcher, as the daemon
does (orchestration/run_launcher.py: a process forked per run from a template started before the clock), and each
run's process records its events and waits for its step's result. The daemon's own loops (sensor ticks, dequeuing
runs) are not part of it. Times are from "files registered" to
"idle", once every worker is ready.

Where the time goes: a psutil sampler charges every process's CPU seconds to a worker, the driver, PostgreSQL,
the Bolt server, Redis, the bench itself or the rest of the machine (other users), and each worker's step time
comes from its log. From celery-1's figures, two workers on two cores can be at most 2W / (W + C) times faster
(W the worker's CPU, C the coordinators'): that bound is in the RESULT as `cpu_bound_1w`.

  speedup_2_vs_1      celery-1 time / celery-2 time (target >= 1.6)
  celery_overhead_1w  celery-1 time / inproc-1 time (target <= 1.15)

  .venv/bin/python bench/scale_out.py [--documents 20] [--pages 10] [--page-keys 0] [--chunk-keys 0]
        [--scanned] [--runs-per-worker 2] [--spread in-flight|workers] [--hosts namespaces|loopback]
        [--run-start forkserver|spawn]
        [--admin-url URL]

Needs the cluster extra (`pip install -e .[cluster]`) and redis-server. Ends with one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._pipeline_env import own_bolt_server, pipeline_env  # noqa: E402
from bench._result import print_result  # noqa: E402
from bench.orchestration_overhead import Databases, _ingest, clean_graph, free_port, make_corpus, outcome, services  # noqa: E402

DOCQUEUE = Path(sys.executable).with_name("docqueue")
ONE_THREAD = {
    name: "1"
    for name in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
    )
}
ONE_THREAD.update({"TOKENIZERS_PARALLELISM": "false", "DOCQUEUE_EMBED_THREADS": "1"})


def scanned_copies(folder: Path, dpi: int = 150) -> None:
    """Replace every PDF in `folder` by a scan of itself: each page a grey picture at `dpi`, no text layer, so that
    every page goes through OCR (the phase that outgrows a machine first)."""
    import pymupdf

    for path in sorted(folder.glob("*.pdf")):
        source, scan = pymupdf.open(path), pymupdf.open()
        for page in source:
            picture = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY).tobytes("png")
            scan.new_page(width=page.rect.width, height=page.rect.height).insert_image(page.rect, stream=picture)
        source.close()
        scan.save(path.with_suffix(".scan"), garbage=1, deflate=True)
        scan.close()
        path.with_suffix(".scan").replace(path)


def run_keys(page_keys: int, chunk_keys: int) -> dict[str, str]:
    """The maxima of keys per run the bench sets; 0 leaves a kind's to the product's setting."""
    keys = {
        "DOCQUEUE_RUN_MAX_KEYS_OCR_PAGE": page_keys,
        "DOCQUEUE_RUN_MAX_KEYS_VECTOR_PAGE": page_keys,
        "DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK": chunk_keys,
        "DOCQUEUE_RUN_MAX_KEYS_GRAPHRAG_CHUNK": chunk_keys,
    }
    return {name: str(value) for name, value in keys.items() if value > 0}


# ------------------------------------------------------------------------------------------------ the children
class Launches:
    """Runs launched as the daemon launches them: created in the run storage with their job's code origin and the
    planned range's tags, then started by the instance's run launcher (orchestration/run_launcher.py: each run in a
    process forked from a template that loaded the code location, started before the clock as a daemon's is)."""

    def __init__(self, instance, start_method: str):
        from dagster._core.definitions.reconstruct import ReconstructableRepository

        from orchestration.run_launcher import ForkedRunLauncher
        from orchestration.runner import QUIET_CONSOLE

        self.instance, self.run_config = instance, QUIET_CONSOLE
        self.repository = ReconstructableRepository.for_module(
            "orchestration.definitions", "defs", working_directory=str(REPO)
        )
        self.launcher = ForkedRunLauncher(start_method=start_method)
        self.launcher.register_instance(instance)
        self.launcher.warm()
        self.jobs: dict = {}

    def launch(self, job_name: str, tags: dict) -> str:
        import dagster as dg
        from dagster._core.definitions.reconstruct import ReconstructableJob
        from dagster._core.launcher.base import LaunchRunContext

        if job_name not in self.jobs:
            job = ReconstructableJob(self.repository, job_name)
            self.jobs[job_name] = (job, job.get_definition())
        job, definition = self.jobs[job_name]
        run = self.instance.create_run_for_job(
            job_def=definition,
            job_code_origin=job.get_python_origin(),
            tags=tags,
            run_config=self.run_config,
            status=dg.DagsterRunStatus.NOT_STARTED,
        )
        self.launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        return run.run_id

    def finished(self, run_ids) -> dict[str, bool]:
        """Of `run_ids`, those that ended, and whether each succeeded."""
        import dagster as dg

        runs = self.instance.get_runs(filters=dg.RunsFilter(run_ids=list(run_ids)))
        return {run.run_id: run.status == dg.DagsterRunStatus.SUCCESS for run in runs if run.is_finished}


def drive_celery(workers: int, runs_per_worker: int) -> dict:
    """Plan ranged runs as the sensors do and launch each as the daemon does (Launches), keeping `runs_per_worker`
    runs going at once per worker, until nothing is left; each run's step goes through the job's own executor
    (Celery). The runs in flight are what the pools' limits are to the daemon, so the runs are sized for them as the
    sensors size them for a pool's limit (BENCH_SPREAD=workers sizes them for the workers instead)."""
    in_flight = workers * runs_per_worker
    slots = workers if os.environ.get("BENCH_SPREAD") == "workers" else in_flight
    from orchestration.environment import dagster_instance
    from orchestration.jobs import job_name
    from orchestration.partitions import register_partitions
    from orchestration.runner import plan_next
    from queue_db.config import Settings
    from queue_db.inspection import outlook
    from queue_db.phases import Level
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    documents = _ingest(queue, Path(os.environ["BENCH_CORPUS"]))
    launches = Launches(instance, os.environ["BENCH_RUN_START"])
    runs = failed = 0
    running: dict[str, tuple] = {}
    started = time.perf_counter()
    Path(os.environ["BENCH_CLOCK"]).touch()
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    while True:
        if len(running) < in_flight:
            busy = set(running.values())
            for run in plan_next(queue, instance, dagster=Settings.from_env().dagster, slots=slots):
                ident = (run.name, run.block, run.start_pos, run.end_pos)
                if len(running) >= in_flight:
                    break
                if ident not in busy:
                    running[launches.launch(job_name(run.name), dict(run.tags))] = ident
                    busy.add(ident)
        if running:
            ended = launches.finished(running)
            for run_id, succeeded in ended.items():
                running.pop(run_id)
                runs += 1
                failed += 0 if succeeded else 1
            if not ended:
                time.sleep(0.05)
            continue
        now = outlook(queue.engine)
        if now.held and sum(queue.recover_stale().values()):
            continue
        if now.settled:
            break
        time.sleep(0.5)
    seconds = time.perf_counter() - started
    instance.dispose()
    return {"documents": documents, "seconds": seconds, "runs": runs, "failed_runs": failed, **_sizes(queue)}


def drive_in_process() -> dict:
    from orchestration.definitions import defs
    from orchestration.environment import dagster_instance
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings
    from queue_db.phases import Level
    from resources.database import open_queue

    os.sched_setaffinity(0, {int(os.environ["BENCH_CORE"])})
    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    documents = _ingest(queue, Path(os.environ["BENCH_CORPUS"]))
    started = time.perf_counter()
    Path(os.environ["BENCH_CLOCK"]).touch()
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    report = run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, poll_s=0.5)
    seconds = time.perf_counter() - started
    instance.dispose()
    return {
        "documents": documents,
        "seconds": seconds,
        "runs": report.runs,
        "failed_runs": report.failed_runs,
        **_sizes(queue),
    }


def _sizes(queue) -> dict:
    """What the planners sized the runs by at the end (queue_db.run_costs): per kind, ms a key and s before the work."""
    from queue_db.run_costs import run_costs

    return {
        "run_costs": {
            kind: {"key_ms": round(c.key_seconds * 1000, 2), "overhead_s": round(c.overhead_seconds, 3), "runs": c.runs}
            for kind, c in run_costs(queue.engine).items()
        }
    }


def child_main(variant: str) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("dagster").setLevel(logging.WARNING)
    result = (
        drive_in_process()
        if variant == "inproc"
        else drive_celery(int(variant.split("-")[1]), int(os.environ["BENCH_RUNS_PER_WORKER"]))
    )
    Path(os.environ["BENCH_RESULT"]).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------ CPU by process
class CpuSampler:
    """CPU seconds per role while a variant runs, from psutil samples of every process on the machine.

    A process's role is that of its nearest ancestor (or itself) among the roots given: each worker (its Celery
    parent and prefork children), the driver child, the bench's PostgreSQL (postmaster and backends), the Bolt
    server, Redis and the bench itself; everything else on the machine is `rest of machine` (other users' load).
    A process that ends between two samples loses at most one interval of its time."""

    def __init__(self, roots: dict[int, str], clock_started: Path, interval_s: float = 0.5):
        import psutil

        self.psutil, self.roots, self.interval_s = psutil, dict(roots), interval_s
        self.clock_started, self.counting = clock_started, False
        self.last: dict[int, tuple[str, float]] = {}
        self.roles: dict[int, str] = {}
        self.stopping = False
        self._start_counting()
        import threading

        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def add_root(self, pid: int, role: str) -> None:
        self.roots[pid] = role

    def _machine_busy(self) -> float:
        times = self.psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def _role(self, process) -> str:
        pid = process.pid
        if pid in self.roots:
            return self.roots[pid]
        if pid in self.roles:
            return self.roles[pid]
        chain, current = [], process
        role = "rest of machine"
        while current is not None and current.pid > 1:
            if current.pid in self.roots:
                role = self.roots[current.pid]
                break
            chain.append(current.pid)
            try:
                current = current.parent()
            except self.psutil.Error:
                break
        for seen in chain:
            self.roles[seen] = role
        return role

    def _sample(self) -> None:
        for process in self.psutil.process_iter():
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    total = times.user + times.system
                    born = process.create_time()
                role = self._role(process)
            except self.psutil.Error:
                continue
            # a process older than the variant counts from the first sample, a new one from zero
            self.first.setdefault(process.pid, total if born < self.started else 0.0)
            self.last[process.pid] = (role, total)

    def _start_counting(self) -> None:
        """Count from now: the child's imports and warm-up happen before its clock starts, so they are left out."""
        self.first: dict[int, float] = {}
        self.started = time.time()
        self.machine_start = self._machine_busy()
        self.wall_start = time.perf_counter()
        self._sample()

    def _loop(self) -> None:
        while not self.stopping:
            time.sleep(self.interval_s)
            if not self.counting and self.clock_started.exists():
                self.counting = True
                self._start_counting()
            else:
                self._sample()

    def stop(self) -> dict:
        self.stopping = True
        self.thread.join()
        self._sample()
        wall = time.perf_counter() - self.wall_start
        by_role: dict[str, float] = {}
        for pid, (role, total) in self.last.items():
            by_role[role] = by_role.get(role, 0.0) + max(0.0, total - self.first.get(pid, 0.0))
        machine = self._machine_busy() - self.machine_start
        return {
            "wall_s": round(wall, 1),
            "machine_busy_cpu_s": round(machine, 1),
            "machine_capacity_cpu_s": round(wall * (os.cpu_count() or 1), 1),
            "cpu_s": {role: round(seconds, 1) for role, seconds in sorted(by_role.items(), key=lambda kv: -kv[1])},
        }


def service_roots(root: Path, redis_pid: int) -> dict[int, str]:
    """The bench's own servers: PostgreSQL and the Bolt server are found by their data folders under `root`."""
    import psutil

    roots = {os.getpid(): "bench (parent)", redis_pid: "redis"}
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(root / "pg") in cmdline and "postgres" in cmdline:
            roots.setdefault(process.info["pid"], "postgres")
        elif str(root / "bolt") in cmdline:
            roots.setdefault(process.info["pid"], "bolt server")
    return roots


# ------------------------------------------------------------------------------------------------ the parent
class Redis:
    def __init__(self, host: str = "127.0.0.1"):
        self.port = free_port()
        self.process = subprocess.Popen(
            ["redis-server", "--bind", host, "--port", str(self.port), "--save", "", "--appendonly", "no"]
            + ["--protected-mode", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://{host}:{self.port}/0"
        from tests.network_hosts import wait_port

        try:
            wait_port(host, self.port, timeout_s=20)
        except AssertionError:
            raise SystemExit("redis-server did not start") from None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class Hosts:
    """Where the workers run. With network namespaces (the default, as tests/acceptance/test_cluster.py does), each
    worker is a "machine" of its own that reaches the broker, PostgreSQL and the Bolt server over a veth pair on a
    private bridge, and those listen on the bridge's address; on loopback (`--hosts loopback`, or where namespaces
    cannot be made) everything shares 127.0.0.1. The driver, the services and the in-process arm stay on the host."""

    def __init__(self, wanted: str, workers: int):
        from tests.network_hosts import Machines, namespaces_unusable

        self.machines = None
        self.why_loopback = "asked for, or --admin-url given" if wanted == "loopback" else namespaces_unusable()
        if self.why_loopback is None:
            self.machines = Machines(workers)
            self.machines.create()
        self.address = self.machines.host_ip if self.machines else "127.0.0.1"

    @property
    def name(self) -> str:
        return "network namespaces" if self.machines else "loopback"

    def prefix(self, index: int) -> list[str]:
        """The command prefix that runs worker `index` on its machine."""
        return ["ip", "netns", "exec", self.machines.namespaces[index]] if self.machines else []

    def seen_from_workers(self, url: str) -> str:
        """A service URL of the host as a worker reaches it (the services listen on the bridge's address too)."""
        return url.replace("127.0.0.1", self.address)

    def remove(self) -> None:
        if self.machines:
            self.machines.remove()


@contextmanager
def cluster_services(root: Path, admin_url: str | None, hosts: Hosts):
    """The services of bench/orchestration_overhead.services, listening where the workers reach them: the Bolt
    server on the bridge's address, the embedded PostgreSQL on loopback and that address, trusting the bridge's
    network. A server given by --admin-url is used as it listens (on loopback, the workers cannot reach it from a
    namespace: use --hosts loopback with it)."""
    if hosts.machines is None or admin_url:
        with services(root, admin_url) as found:
            yield found
        return
    from queue_db.embedded_postgres import EmbeddedPostgres

    try:
        with own_bolt_server(root / "bolt", free_port(), host=hosts.address) as bolt:
            server = EmbeddedPostgres(
                root / "pg", port=free_port(), extra_settings={"listen_addresses": f"'127.0.0.1,{hosts.address}'"}
            )
            server.ensure_running()
            with open(server.pgdata / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {hosts.machines.network} trust\n")
            admin = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
            import psycopg

            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("SELECT pg_reload_conf()")
            databases = Databases(admin)
            try:
                yield bolt, databases
            finally:
                databases.drop_all()
                server.stop(mode="immediate")
    finally:
        shutil.rmtree(root / "bolt", ignore_errors=True)


WORKER_READY_TIMEOUT_S = 300


def start_worker(index: int, env: dict, home: Path, broker: str, hosts: Hosts) -> tuple[subprocess.Popen, object, Path]:
    """One `docqueue worker --concurrency 1` pinned to core `index`, on its machine, in a session of its own so that
    stopping it stops its prefork children too."""
    log_path = home / f"worker-{index}.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [
            *hosts.prefix(index),
            "taskset",
            "-c",
            str(index % (os.cpu_count() or 1)),
            str(DOCQUEUE),
            "worker",
            "--broker",
            broker,
            "--concurrency",
            "1",
            "--name",
            f"bench{index}@%h",
        ],
        env=env,
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return process, log, log_path


def wait_ready(workers: list) -> None:
    """Until every worker said `ready` (its definitions and models' code loaded): the clock must not time start-up."""
    deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
    for process, _, log_path in workers:
        while b" ready." not in log_path.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)


def step_seconds(log_path: Path) -> dict:
    """The steps a worker ran and the seconds Celery says they took (its `succeeded in Xs` lines): how much of the
    variant's time a worker was busy at all, whatever the CPU it got."""
    import re

    took = [float(m) for m in re.findall(rb"succeeded in ([0-9.]+)s", log_path.read_bytes())]
    return {"steps": len(took), "busy_s": round(sum(took), 1)}


def stop_worker(process: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass
    try:  # prefork children left behind by a warm shutdown
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_variant(
    variant: str,
    corpus: Path,
    databases: Databases,
    bolt: dict,
    root: Path,
    redis: "Redis",
    keys: dict[str, str],
    runs_per_worker: int,
    hosts: Hosts,
    run_start: str,
) -> dict:
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    queue_url = databases.create("queue")
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    home = root / f"{variant}-{uuid.uuid4().hex[:6]}"
    (home / "storage").mkdir(parents=True)
    clean_graph(bolt)
    env = {
        **os.environ,
        **ONE_THREAD,
        **keys,
        **pipeline_env(home, queue_url, databases.create("dagster"), bolt),
        "DOCQUEUE_STORAGE_DIR": str(home / "storage"),
        "BENCH_CORPUS": str(corpus),
        "BENCH_CORE": "0",
        "BENCH_RESULT": str(home / "result.json"),
        "BENCH_CLOCK": str(home / "clock-started"),
        "BENCH_RUNS_PER_WORKER": str(runs_per_worker),
        "BENCH_RUN_START": run_start,
    }
    workers = []
    roots = service_roots(root, redis.process.pid)
    if variant.startswith("celery"):
        env.update({"DOCQUEUE_EXECUTOR": "celery", "DOCQUEUE_BROKER_URL": redis.url})
    try:
        worker_env = {
            **env,
            **{
                name: hosts.seen_from_workers(env[name])
                for name in ("DOCQUEUE_DATABASE_URL", "DOCQUEUE_DAGSTER_PG_URL")
            },
        }
        for index in range(int(variant.split("-")[1]) if variant.startswith("celery") else 0):
            workers.append(start_worker(index, worker_env, home, redis.url, hosts))
            roots[workers[-1][0].pid] = f"worker {index}"
        wait_ready(workers)
        sampler = CpuSampler(roots, home / "clock-started")
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", variant],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        sampler.add_root(child.pid, "driver" if workers else "in-process runner")
        _, stderr = child.communicate()
        wall = time.perf_counter() - started
        cpu = sampler.stop()
    finally:
        for process, log, _ in workers:
            stop_worker(process)
            log.close()
    busy = {f"worker {i}": step_seconds(log_path) for i, (_, _, log_path) in enumerate(workers)}
    if child.returncode != 0 or not (home / "result.json").is_file():
        raise SystemExit(f"{variant} child failed ({child.returncode}):\n{stderr[-3000:]}")
    result = {
        **json.loads((home / "result.json").read_text()),
        "process_wall_s": round(wall, 2),
        "outcome": outcome(queue_url),
        "cpu": cpu,
        "steps": busy,
    }
    shutil.rmtree(home, ignore_errors=True)
    return result


def print_cpu(variant: str, result: dict) -> None:
    cpu = result["cpu"]
    print(
        f"  CPU over {cpu['wall_s']} s (machine busy {cpu['machine_busy_cpu_s']} of {cpu['machine_capacity_cpu_s']} "
        f"CPU s): " + ", ".join(f"{role} {seconds}" for role, seconds in cpu["cpu_s"].items() if seconds >= 0.1),
        flush=True,
    )
    for worker, steps in result["steps"].items():
        print(f"  {worker}: {steps['steps']} steps, busy {steps['busy_s']} s of {result['seconds']:.1f} s", flush=True)


COORDINATORS = ("driver", "postgres", "bolt server", "redis")


def cpu_bound(cpu_s: dict) -> dict:
    """What one worker's CPU says about two on two cores of their own: the worker's CPU W can be split across
    the cores, the coordinators' CPU C (the driver and its run processes, PostgreSQL, the Bolt server, the broker)
    must share them, so T2 >= (W + C) / 2 while T1 >= W; when the one-worker run is CPU-bound (T1 close to W)
    the speedup is at most 2W / (W + C), and >= 1.6 needs C <= W / 4. On a machine other users load, T1 is far
    above W and the measured speedup can exceed this figure. The bench's own sampling is left out of C."""
    workers = sum(seconds for role, seconds in cpu_s.items() if role.startswith("worker"))
    coordinators = sum(cpu_s.get(role, 0.0) for role in COORDINATORS)
    total = sum(cpu_s.values())
    return {
        "worker_cpu_s": round(workers, 1),
        "coordinator_cpu_s": round(coordinators, 1),
        "coordinator_per_worker_cpu": round(coordinators / workers, 3) if workers else None,
        "speedup_bound_if_cpu_bound": (round(min(2.0, 2 * workers / (workers + coordinators)), 3) if workers else None),
        "rest_of_machine_share": round(cpu_s.get("rest of machine", 0.0) / total, 3) if total else None,
    }


def parent_main(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="docqueue-bench-scale-"))
    # a server given by --admin-url listens where it was set up, which a namespace may not reach
    hosts = Hosts("loopback" if args.admin_url else args.hosts, 2)
    print(f"workers on {hosts.name}" + (f" ({hosts.why_loopback})" if hosts.why_loopback else ""), flush=True)
    results, load_before = {}, os.getloadavg()
    try:
        redis = Redis(hosts.address)
        try:
            corpus = root / "corpus"
            make_corpus(corpus, args.documents, args.pages)
            if args.scanned:
                scanned_copies(corpus)
            with cluster_services(root, args.admin_url, hosts) as (bolt, databases):
                for variant in ("celery-1", "inproc", "celery-2"):
                    results[variant] = r = run_variant(
                        variant,
                        corpus,
                        databases,
                        bolt,
                        root,
                        redis,
                        {**run_keys(args.page_keys, args.chunk_keys), "BENCH_SPREAD": args.spread},
                        args.runs_per_worker,
                        hosts,
                        args.run_start,
                    )
                    print(
                        f"{variant:9s}: {r['seconds']:7.1f} s, {r['runs']} runs ({r['failed_runs']} failed), "
                        f"{r['outcome']}",
                        flush=True,
                    )
                    print_cpu(variant, r)
        finally:
            redis.stop()
    finally:
        hosts.remove()
        shutil.rmtree(root, ignore_errors=True)
    one, two, inproc = (results[v]["seconds"] for v in ("celery-1", "celery-2", "inproc"))
    chunks = results["celery-1"]["outcome"]["vectors"]
    same = len({json.dumps(r["outcome"], sort_keys=True) for r in results.values()}) == 1
    print(f"\ncorpus: {args.documents} documents x {args.pages} pages, {chunks} chunks; same outcome every way: {same}")
    print(f"celery, 1 worker : {one:7.1f} s ({chunks / one:.2f} chunks/s)")
    print(f"celery, 2 workers: {two:7.1f} s ({chunks / two:.2f} chunks/s)  speedup {one / two:.2f} (target >= 1.6)")
    print(f"in-process, 1    : {inproc:7.1f} s  celery overhead {one / inproc:.2f} (target <= 1.15)")
    bound = cpu_bound(results["celery-1"]["cpu"]["cpu_s"])
    print(
        f"CPU of celery-1: workers {bound['worker_cpu_s']} s, coordinators (driver, PostgreSQL, Bolt, Redis) "
        f"{bound['coordinator_cpu_s']} s: on 2 cores of their own and CPU-bound, two workers would be at most "
        f"{bound['speedup_bound_if_cpu_bound']:.2f}x faster; the rest of the machine took "
        f"{bound['rest_of_machine_share']:.0%} of its CPU"
    )
    per_run = {
        v: sum(r["cpu"]["cpu_s"].get(role, 0.0) for role in COORDINATORS) / max(1, r["runs"])
        for v, r in results.items()
    }
    print("coordinators' CPU s a run: " + ", ".join(f"{v} {seconds:.3f}" for v, seconds in per_run.items()))
    print(f"machine load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print_result(
        {
            "documents": args.documents,
            "pages": args.pages,
            "chunks": chunks,
            "page_keys": args.page_keys,
            "chunk_keys": args.chunk_keys,
            "scanned": args.scanned,
            "runs_per_worker": args.runs_per_worker,
            "same_outcome": same,
            "celery_1w_s": round(one, 2),
            "celery_2w_s": round(two, 2),
            "inproc_1w_s": round(inproc, 2),
            "speedup_2_vs_1": round(one / two, 3),
            "celery_overhead_1w": round(one / inproc, 3),
            "runs": {v: r["runs"] for v, r in results.items()},
            "run_costs": {v: r.get("run_costs", {}) for v, r in results.items()},
            "cores": os.cpu_count(),
            "cpu": {v: r["cpu"] for v, r in results.items()},
            "worker_steps": {v: r["steps"] for v, r in results.items() if r["steps"]},
            "cpu_bound_1w": bound,
            # what the driver, PostgreSQL, the Bolt server and the broker spend a run, in each variant
            "coordinator_cpu_s_per_run": {v: round(seconds, 3) for v, seconds in per_run.items()},
            "workers_on": hosts.name,
            "run_start": args.run_start,
            "spread": args.spread,
            "load_before": round(load_before[0], 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument(
        "--page-keys",
        type=int,
        default=0,
        help="at most this many pages per OCR and chunking run (0: the product's DOCQUEUE_RUN_MAX_KEYS_*); below it "
        "runs are sized from what they measure (DOCQUEUE_RUN_OVERHEAD_SHARE, 0 turns that off)",
    )
    parser.add_argument(
        "--chunk-keys", type=int, default=0, help="at most this many chunks per embedding and extraction run (0: same)"
    )
    parser.add_argument(
        "--scanned", action="store_true", help="every page a scan without a text layer, so that every page is OCRed"
    )
    parser.add_argument(
        "--runs-per-worker",
        type=int,
        default=2,
        help="runs in flight per worker: above 1, a worker's next step waits on the broker while "
        "the run it just finished is recorded",
    )
    parser.add_argument(
        "--hosts",
        choices=("namespaces", "loopback"),
        default="namespaces",
        help="where the workers run: each in a network namespace of its own (the default; loopback where "
        "namespaces cannot be made), or on the host's loopback",
    )
    parser.add_argument(
        "--spread",
        choices=("in-flight", "workers"),
        default="in-flight",
        help="what the driver sizes runs to spread over when little is ready: the runs it keeps in flight, as the "
        "sensors do with a pool's limit (default), or the workers",
    )
    parser.add_argument(
        "--run-start",
        choices=("forkserver", "spawn"),
        default="forkserver",
        help="how the Celery variants' runs start: forked from the launcher's template (docqueue's launcher, the "
        "default), or each in a new interpreter, as Dagster's code server starts them",
    )
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
