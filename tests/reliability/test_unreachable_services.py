"""Every command (as `docqueue --help` lists them) with each service it reaches out of reach: it exits non-zero
with one `docqueue: ...` sentence on stderr and no traceback.

Services out of reach: the queue's PostgreSQL URL on a closed port, a Bolt URI on a closed port, a Qdrant server URL
on a closed port, and the embedded PostgreSQL's or Bolt server's explicit port held by another listener. The
commands run in parallel subprocesses: each is mostly interpreter start-up.
"""

from __future__ import annotations

import re
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.acceptance.test_cli import DOCQUEUE, Result, succeeded
from tests.acceptance.test_first_hour import NOTE, run_as_user, user_env

QUEUE, GRAPH, VECTORS = "queue", "graph", "vectors"
# per command: its arguments (`document` is the key of a registered document) and the services it reaches. `db stop`
# stops what runs under DOCQUEUE_HOME and reaches none; `ui` reaches only PostgreSQL (with it up it would serve).
COMMANDS = {
    "db upgrade": (lambda f: ["db", "upgrade"], {QUEUE}),
    "db stop": (lambda f: ["db", "stop"], set()),
    "db status": (lambda f: ["db", "status"], {QUEUE}),
    "priority": (lambda f: ["priority", f["document"], "5"], {QUEUE}),
    # a cluster worker reaches the broker only; without one it refuses before anything else
    "worker": (lambda f: ["worker"], set()),
    "ingest": (lambda f: ["ingest", f["note"]], {QUEUE}),
    "run": (lambda f: ["run", "--until-idle"], {QUEUE, GRAPH, VECTORS}),
    "status": (lambda f: ["status"], {QUEUE}),
    "stats": (lambda f: ["stats"], {QUEUE}),
    "recover": (lambda f: ["recover"], {QUEUE}),
    "retry": (lambda f: ["retry"], {QUEUE}),
    "verify": (lambda f: ["verify"], {QUEUE, GRAPH, VECTORS}),
    "search": (lambda f: ["search", "anything at all"], {QUEUE, VECTORS}),
    "graph": (lambda f: ["graph", "anyone"], {QUEUE, GRAPH}),
    "ui": (lambda f: ["ui", "--port", str(f["ui_port"])], {QUEUE}),
    "delete": (lambda f: ["delete", f["document"]], {QUEUE, GRAPH, VECTORS}),
    # --phase vector upgrades a vector collection made before hybrid search first
    "reindex": (lambda f: ["reindex", "--phase", "vector"], {QUEUE, VECTORS}),
    # signs from the stored page texts (the storage folder): the queue is the only service it reaches
    "regroup": (lambda f: ["regroup"], {QUEUE}),
    "demo": (lambda f: ["demo"], {QUEUE, GRAPH, VECTORS}),
    # --graph against a Bolt server at a URI refuses in one sentence; the embedded one is started as by `run`
    "repair": (lambda f: ["repair", "--vectors", "--graph"], {QUEUE, GRAPH, VECTORS}),
}


def _listed_commands() -> set[str]:
    import subprocess

    def names(*group: str) -> list[str]:
        out = subprocess.run([DOCQUEUE, *group, "--help"], capture_output=True, text=True, check=True).stdout
        return re.findall(r"^  ([a-z][a-z-]*)\s", out.split("Commands:", 1)[1], flags=re.M)

    listed = set()
    for name in names():
        listed |= {f"db {sub}" for sub in names("db")} if name == "db" else {name}
    return listed


def test_the_table_lists_every_command():
    assert _listed_commands() == set(COMMANDS)


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def listener():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def reachable(tmp_path, create_database, migrated_template, bolt_server):
    """Settings under which every service answers, with one registered document; the scenarios break one each."""
    (tmp_path / "note.md").write_text(NOTE)
    settings = {
        "DOCQUEUE_DATABASE_URL": create_database(template=migrated_template),
        "DOCQUEUE_DAGSTER_PG_URL": create_database(prefix="dagster"),
        "DOCQUEUE_NEO4J_URI": bolt_server.uri,
        "DOCQUEUE_NEO4J_USER": bolt_server.user,
        "DOCQUEUE_NEO4J_PASSWORD": bolt_server.password,
        "DOCQUEUE_NEO4J_DATABASE": bolt_server.database or "",
        "DOCQUEUE_CLI_GRAPH_RETRY_S": "0.5",
        "DOCQUEUE_QDRANT_TIMEOUT": "2",
    }
    home = tmp_path / "home"
    (registered,) = succeeded(
        run_as_user(user_env(home, **settings), "ingest", str(tmp_path / "note.md"), "--json")
    ).json()["results"]
    files = {"note": str(tmp_path / "note.md"), "document": registered["document_key"], "ui_port": _closed_port()}
    return home, settings, files


def _without(settings: dict, *names: str) -> dict:
    return {k: v for k, v in settings.items() if k not in names}


def test_every_command_fails_with_one_sentence_when_a_service_is_out_of_reach(reachable, listener):
    home, settings, files = reachable
    closed = _closed_port()
    scenarios = {
        "queue database on a closed port": (
            QUEUE,
            {**settings, "DOCQUEUE_DATABASE_URL": f"postgresql://postgres:hunter2@127.0.0.1:{closed}/docqueue"},
        ),
        "embedded PostgreSQL's port taken": (
            QUEUE,
            {
                **_without(settings, "DOCQUEUE_DATABASE_URL", "DOCQUEUE_DAGSTER_PG_URL"),
                "DOCQUEUE_PG_PORT": str(listener),
            },
        ),
        "Bolt server on a closed port": (GRAPH, {**settings, "DOCQUEUE_NEO4J_URI": f"bolt://127.0.0.1:{closed}"}),
        "embedded Bolt server's port taken": (
            GRAPH,
            {**_without(settings, "DOCQUEUE_NEO4J_URI"), "DOCQUEUE_BOLT_PORT": str(listener)},
        ),
        "Qdrant server on a closed port": (VECTORS, {**settings, "DOCQUEUE_QDRANT_URL": f"http://127.0.0.1:{closed}"}),
    }
    jobs = []
    for index, (scenario, (service, environment)) in enumerate(scenarios.items()):
        env = user_env(home.with_name(f"home-{index}") if "embedded" in scenario else home, **environment)
        jobs += [(scenario, env, args(files)) for args, reaches in COMMANDS.values() if service in reaches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run_as_user(job[1], *job[2], timeout=240), jobs))

    problems = [
        f"{scenario} / docqueue {' '.join(result.args)}: {problem}"
        for (scenario, _, _), result in zip(jobs, results)
        if (problem := _problem(result))
    ]
    assert not problems, "\n".join(problems)


def _problem(result: Result) -> str | None:
    lines = [line for line in result.err.splitlines() if line.strip()]
    if "Traceback" in result.err:
        return f"traceback:\n{result.err}"
    if "hunter2" in result.err + result.out:
        return "the password is shown"
    if result.code == 0:
        return "succeeded without a service it needs"
    if len(lines) != 1 or not lines[0].startswith("docqueue: "):
        return f"exit {result.code} without exactly one `docqueue: ...` sentence on stderr:\n{result.err}"
    return None
