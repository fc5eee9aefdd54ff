"""A pre-forking parent of worker processes for the fault tests.

Importing dagster, the definitions and the resources costs a worker 6-25 s of start-up on the shared 2-core
machine; a test that kills and restarts workers a dozen times cannot pay that each time. This process imports
everything once (and opens nothing: no database connection, no model session, no thread), then forks a fresh
worker per request, the way a pre-forking server does. Each worker sets up its own environment, instance, engine
and models after the fork and runs `orchestration.runner.run_until_idle`, exactly like `docqueue run`.

Protocol (one line each, stdin -> stdout):
    spawn <name> <json: environment, options>   ->  spawned <name> <pid>
        options: stderr (a log file), crash_on, slow_kinds + slow_s (fault injection, tests/reliability/bodies.py),
        poll, max_seconds, or target ("module:function", called with the options instead of the runner loop)
    (a worker ends)                              ->  exited <name> <pid> <exit status or -signal>
    (a worker's report)                          ->  report <name> <pid> <json>
    quit                                         ->  (exits once its workers are gone)
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import warnings


def _prepare() -> None:
    warnings.filterwarnings("ignore")
    import spacy  # noqa: F401

    import orchestration.code_location  # noqa: F401 - the expensive imports, once (no definitions built)
    import orchestration.runner  # noqa: F401
    import resources.embeddings  # noqa: F401
    import resources.extraction  # noqa: F401


def _child(name: str, spec: dict) -> None:
    """The forked worker: its own environment and connections, then the runner loop."""
    os.environ.clear()
    os.environ.update(spec["env"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if spec.get("stderr"):
        log = os.open(spec["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 2)
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings
    from resources.database import open_queue

    if spec.get("target"):  # a test's own worker body, "module:function(spec)"
        import importlib

        module, _, function = spec["target"].partition(":")
        getattr(importlib.import_module(module), function)(spec)
        return
    if spec.get("slow_kinds"):
        from tests.reliability.bodies import inject_delay

        inject_delay(spec["slow_kinds"], spec.get("slow_s", 0.5))
    if spec.get("crash_on"):
        from tests.reliability.bodies import inject_crash

        inject_crash(spec["crash_on"])
    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    report = run_until_idle(
        defs,
        instance,
        queue,
        settings=Settings.from_env(),
        until_idle=True,
        poll_s=spec.get("poll", 0.3),
        max_seconds=spec.get("max_seconds", 300),
    )
    line = json.dumps({"runs": report.runs, "failed_runs": report.failed_runs, "seconds": round(report.seconds, 2)})
    sys.stdout.write(f"report {name} {os.getpid()} {line}\n")
    sys.stdout.flush()


def _spawn(name: str, spec: dict, children: dict[int, str]) -> None:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _child(name, spec)
        except BaseException as exc:  # noqa: BLE001 - reported through the exit status and stderr
            import traceback

            traceback.print_exc()
            code = 3 if not isinstance(exc, SystemExit) else int(exc.code or 0)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    children[pid] = name
    print(f"spawned {name} {pid}", flush=True)


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"exited {children.pop(pid, '?')} {pid} {code}", flush=True)


def _lines(buffer: bytearray):
    """Complete lines read so far from stdin (select() on the raw descriptor, so none waits in a buffer)."""
    chunk = os.read(0, 65536)
    if not chunk:
        return None
    buffer += chunk
    *complete, rest = buffer.split(b"\n")
    buffer[:] = rest
    return [line.decode() for line in complete]


def main() -> None:
    _prepare()
    print("ready", flush=True)
    children: dict[int, str] = {}
    buffer = bytearray()
    quitting = False
    while not quitting or children:
        if quitting:
            time.sleep(0.05)
        elif select.select([0], [], [], 0.05)[0]:
            lines = _lines(buffer)
            for line in lines if lines is not None else ["quit"]:
                if line.strip() == "quit":
                    quitting = True
                    for pid in list(children):  # only our own workers, by pid
                        os.kill(pid, signal.SIGKILL)
                elif line.strip():
                    _, name, payload = line.split(" ", 2)
                    _spawn(name, json.loads(payload), children)
        _reap(children)


if __name__ == "__main__":
    main()
