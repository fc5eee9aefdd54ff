"""Seeing docqueue at work: `docqueue ui` (the Dagster webserver and daemon) and `docqueue demo`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import click

from orchestration.cli.context import open_queue
from orchestration.cli.errors import EXIT_USAGE, CliError
from orchestration.cli.output import console, emit, table
from orchestration.dagster_database import check_dagster_storage
from orchestration.environment import prepare_environment
from queue_db.config import Settings

# `dg dev` loads the project that pyproject.toml's [tool.dg] describes (the code location `docqueue`), in this
# interpreter, from the project's root whatever the current directory
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@click.command()
@click.option(
    "--port", type=click.IntRange(1, 65535), default=3000, show_default=True, help="port of the webserver on 127.0.0.1"
)
@click.option(
    "--json", "as_json", is_flag=True, help="print the UI's address as JSON on stdout (Dagster logs to stderr)"
)
@click.pass_obj
def ui(settings: Settings, port: int, as_json: bool) -> None:
    """Start the Dagster webserver and daemon (`dg dev`) on 127.0.0.1 with this project loaded."""
    environment = prepare_environment(settings)  # exports DAGSTER_HOME and the URLs the webserver and daemon inherit
    open_queue(settings, environment.queue_url)
    check_dagster_storage(environment.dagster_url)
    if not _port_free(port):
        raise CliError(_port_taken(port), EXIT_USAGE)
    url = f"http://127.0.0.1:{port}"
    emit(
        as_json,
        {"url": url, "dagster_home": str(environment.dagster_home)},
        lambda: click.echo(f"Dagster UI on {url} (Ctrl-C stops it)", err=True),
    )
    sys.stdout.flush()
    dg_cli = shutil.which("dg", path=str(Path(sys.executable).parent)) or "dg"
    command = [
        dg_cli,
        "dev",
        "--use-active-venv",
        "--no-check-yaml",
        "--target-path",
        str(PROJECT_ROOT),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    os.environ["VIRTUAL_ENV"] = sys.prefix
    # with --json stdout carries that one document only: Dagster's own output goes to stderr.
    # `dg dev` gets a session of its own and exactly one interrupt from us: a second one (Ctrl-C reaching the
    # whole terminal group, or SIGTERM to the group) would break off its orderly shutdown of webserver and daemon.
    # Handlers first: a handled signal is default again in the child, while an ignored SIGINT (a background job of
    # a non-interactive shell) would be inherited, and `dg dev` maps SIGTERM to its SIGINT handling.
    # Should this process die without a word (SIGKILL of its group), the kernel sends `dg dev` that same interrupt
    # (the parent-death signal), and it shuts its webserver and daemon down as on Ctrl-C.
    server: list = []
    _forward_stop_signals(server)
    server.append(
        subprocess.Popen(
            command,
            stdout=sys.stderr if as_json else None,
            start_new_session=True,
            preexec_fn=_interrupt_on_parent_death(os.getpid()),
        )
    )
    raise SystemExit(server[0].wait())


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _interrupt_on_parent_death(parent: int):
    """In the child, before `dg dev` starts: SIGINT once `parent` dies (Linux; elsewhere nothing). A parent gone
    already, between the fork and this call, interrupts at once."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGINT)

    return arm


def _forward_stop_signals(server: list) -> None:
    """SIGINT/SIGTERM: ask `dg dev` (server[0], once started) to shut down; a second one kills its session."""
    asked: list[int] = []

    def stop(signum, frame) -> None:
        if not server:
            raise SystemExit(128 + signum)
        if server[0].poll() is not None:
            return
        if not asked:
            asked.append(signum)
            click.echo("stopping the Dagster webserver and daemon (again to force)", err=True)
            server[0].send_signal(signal.SIGINT)
        else:
            os.killpg(server[0].pid, signal.SIGKILL)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _port_taken(port: int) -> str:
    """The sentence for a port in use, naming what serves it when that is a Dagster webserver (a `docqueue ui`
    left running, for instance) and the process that listens, when this user may see it."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=3) as reply:
            answer = json.loads(reply.read())
        what = f"a Dagster webserver ({answer['dagster_webserver_version']}) already serves it"
    except (OSError, ValueError, KeyError, TypeError):
        what = "another program listens on it"
    listener = _listener(port)
    who = f" (pid {listener[0]}: {listener[1]})" if listener else ""
    return f"port {port} on 127.0.0.1 is in use: {what}{who}; stop it, or choose another port with --port"


def _listener(port: int) -> tuple[int, str] | None:
    """(pid, command line) of the process listening on 127.0.0.1:`port`, read from /proc; None when unknown."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    # local address 0100007F:PORT (or 00000000 for any address) in state 0A, LISTEN; field 9 is the socket inode
    inodes = {f[9] for f in (line.split() for line in lines) if f[3] == "0A" and f[1].split(":")[1] == f"{port:04X}"}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            if any(fd[len("socket:[") : -1] in inodes for fd in fds if fd.startswith("socket:[")):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return int(proc.name), command[:160]
        except OSError:
            continue
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the webserver does: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def demo(settings: Settings, as_json: bool) -> None:
    """The main job: sample PDFs (text, scanned, broken) processed end to end on the embedded services."""
    # imported here: the demo loads the Dagster definitions, seconds that `docqueue ui` does not need
    from orchestration.cli.running import check_stores
    from orchestration.demo import run_demo

    check_stores(settings)
    summary = run_demo(settings)
    emit(as_json, summary, lambda: _print_demo(summary))
    if summary["good_documents_completed"] != summary["good_documents"]:
        raise CliError("the demo did not complete every good document; see `docqueue status`")


def _print_demo(summary: dict) -> None:
    shown = console()
    shown.print(
        table(
            "documents per phase status",
            ["phase", "completed", "failed", "blocked", "pending/processing"],
            [[p, c["completed"], c["failed"], c["blocked"], c["open"]] for p, c in summary["phases"].items()],
        )
    )
    shown.print(
        f"chunks: {summary['chunks']}   vectors: {summary['vectors']}   entities: {summary['entities']}   "
        f"relationships: {summary['relationships']}"
    )
    for broken in summary["broken"]:
        shown.print(f"broken file [bold]{broken['filename']}[/bold]: {broken['error']}")
    if summary["search"]:
        hit = summary["search"]["hits"][0] if summary["search"]["hits"] else None
        found = f"{hit['document']} p.{hit['page']} (score {hit['score']}): {hit['text'][:120]}" if hit else "no hit"
        shown.print(f"search {summary['search']['query']!r} -> {found}")
    shown.print(f"took {summary['seconds']} s. Open the UI with: docqueue ui   (then http://127.0.0.1:3000)")
