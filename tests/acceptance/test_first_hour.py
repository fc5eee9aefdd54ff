"""A new user's first hour, command by command, as docs/operations.md tells it: one URL to an own PostgreSQL server, two
projects side by side on the embedded defaults, a fresh embedded home.

The own server is DOCQUEUE_TEST_OWN_PG_URL (default: the PostgreSQL on 127.0.0.1:5432 with a superuser
`postgres`); each test creates uniquely named databases and roles there and drops them at its end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.test_cli import DOCQUEUE, RUN_TIMEOUT_S, Result, refused, succeeded

OWN_ADMIN_URL = os.environ.get("DOCQUEUE_TEST_OWN_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
NOTE = "# Field notes\n\nAda Lovelace wrote to Charles Babbage from London about the Analytical Engine.\n"
# a user's shell has none of these: the embedded defaults (or the one URL a test sets) decide everything
_CONFIGURATION = ("DOCQUEUE_", "DAGSTER_HOME")


def user_env(home: Path, **settings: str) -> dict[str, str]:
    """A clean environment as a new user has it: only DOCQUEUE_HOME and what the test sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONFIGURATION)}
    return {**env, "DOCQUEUE_HOME": str(home), "DOCQUEUE_CLI_GRAPH_RETRY_S": "2", **settings}


def run_as_user(env: dict, *args: str, timeout: float = 300) -> Result:
    """`docqueue` in exactly the user's environment (not layered over the test process's)."""
    started = time.monotonic()
    proc = subprocess.run(
        [DOCQUEUE, *args], capture_output=True, text=True, timeout=timeout, env={**env, "COLUMNS": "200"}
    )
    return Result(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


@pytest.fixture
def own_server():
    """Admin connection to the own server; skipped where no such server runs."""
    try:
        conn = psycopg.connect(OWN_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no own PostgreSQL server at {OWN_ADMIN_URL}: {exc}")
    created: list[tuple[str, str]] = []

    def create(kind: str, name: str, sql: str) -> str:
        conn.execute(sql)
        created.append((kind, name))
        return name

    try:
        yield conn, create
    finally:
        for kind, name in reversed(created):
            if kind == "database":
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                conn.execute(f'DROP DATABASE IF EXISTS "{name}_dagster" WITH (FORCE)')
            else:
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')
        conn.close()


def _url(user: str, database: str) -> str:
    server = OWN_ADMIN_URL.rsplit("/", 1)[0].split("@", 1)[1]
    return f"postgresql://{user}@{server}/{database}"


def test_one_url_to_an_own_server_takes_a_note_through_every_phase(own_server, bolt_server, tmp_path):
    from tests.integration.bolt_fixture import clean_graph

    conn, create = own_server
    name = f"own_{uuid.uuid4().hex[:10]}"
    create("database", name, f'CREATE DATABASE "{name}"')
    clean_graph(bolt_server)
    (tmp_path / "note.md").write_text(NOTE)
    env = user_env(
        tmp_path / "home",
        DOCQUEUE_DATABASE_URL=_url("postgres", name),
        DOCQUEUE_NEO4J_URI=bolt_server.uri,
        DOCQUEUE_NEO4J_USER=bolt_server.user,
        DOCQUEUE_NEO4J_PASSWORD=bolt_server.password,
        DOCQUEUE_NEO4J_DATABASE=bolt_server.database or "",
    )
    note = str(tmp_path / "note.md")

    # a server's database is migrated when its owner says so, never by the first command
    assert "run `docqueue db upgrade`" in refused(run_as_user(env, "ingest", note), code=1)
    upgraded = succeeded_json(run_as_user(env, "db", "upgrade", "--json"))
    assert upgraded["dagster_database_created"] is True and upgraded["dagster_database"].endswith(f"/{name}_dagster")
    assert succeeded_json(run_as_user(env, "db", "upgrade", "--json"))["dagster_database_created"] is False

    (result,) = succeeded_json(run_as_user(env, "ingest", note, "--json"))["results"]
    assert result["status"] == "new"
    run = succeeded_json(run_as_user(env, "run", "--until-idle", "--json", timeout=RUN_TIMEOUT_S))
    assert run["summary"]["failed"] == run["summary"]["blocked"] == run["summary"]["open"] == 0
    assert run["summary"]["by_kind"]["graphrag_chunk"]["completed"] >= 1
    found = succeeded_json(run_as_user(env, "graph", "ada lovelace", "--json"))
    assert {m["filename"] for m in found["mentions"]} == {"note.md"}
    hits = succeeded_json(run_as_user(env, "search", "a letter about the analytical engine", "--json"))["hits"]
    assert hits and hits[0]["document"] == "note.md"

    # Dagster's storage gone: ingest writes only the queue and still registers; a run says so in one sentence
    # at once, not after 15 s of Dagster's connection retries
    conn.execute(f'DROP DATABASE "{name}_dagster" WITH (FORCE)')
    (tmp_path / "second.md").write_text("A second note, about Paris.\n")
    (second,) = succeeded_json(run_as_user(env, "ingest", str(tmp_path / "second.md"), "--json"))["results"]
    assert second["status"] == "new"
    missing = run_as_user(env, "run", "--until-idle")
    message = refused(missing, code=1)
    assert f'"{name}_dagster" does not exist' in message and "docqueue db upgrade" in message, message
    assert "Retrying" not in missing.err and missing.err.count("\n") == 1, missing.err


def test_a_role_that_may_not_create_databases_is_told_what_to_create(own_server, tmp_path):
    conn, create = own_server
    suffix = uuid.uuid4().hex[:10]
    role = create("role", f"own_role_{suffix}", f'CREATE ROLE "own_role_{suffix}" LOGIN NOCREATEDB')
    name = f"own_{suffix}"
    create("database", name, f'CREATE DATABASE "{name}" OWNER "{role}"')
    env = user_env(tmp_path / "home", DOCQUEUE_DATABASE_URL=_url(role, name))
    message = refused(run_as_user(env, "db", "upgrade"), code=1)
    assert f'"{name}_dagster" does not exist' in message and "may not create databases" in message, message
    assert f'CREATE DATABASE "{name}_dagster" OWNER "{role}"' in message


def test_two_embedded_homes_side_by_side_complete_every_phase():
    # not under pytest's basetemp: its mode 0700 locks out the embedded PostgreSQL's own user when run as root
    root = Path(tempfile.mkdtemp(prefix="docqueue-two-homes-"))
    homes = [root / "first", root / "second"]
    envs = [user_env(home / ".docqueue") for home in homes]
    for home in homes:
        home.mkdir()
        (home / "note.md").write_text(NOTE)
    try:
        # a fresh embedded home: the first command creates the schema itself
        for home, env in zip(homes, envs):
            (result,) = succeeded_json(run_as_user(env, "ingest", str(home / "note.md"), "--json"))["results"]
            assert result["status"] == "new"
        with ThreadPoolExecutor(max_workers=2) as pool:
            runs = list(
                pool.map(lambda env: run_as_user(env, "run", "--until-idle", "--json", timeout=RUN_TIMEOUT_S), envs)
            )
        for run in runs:
            summary = succeeded_json(run)["summary"]
            assert summary["failed"] == summary["blocked"] == summary["open"] == 0, summary
            assert summary["by_kind"]["graphrag_chunk"]["completed"] >= 1, summary
        ports = [
            {server: int((home / ".docqueue" / server / "port").read_text()) for server in ("postgres", "bolt")}
            for home in homes
        ]
        assert ports[0]["postgres"] != ports[1]["postgres"] and ports[0]["bolt"] != ports[1]["bolt"], ports
        for env in envs:
            found = succeeded_json(run_as_user(env, "graph", "ada lovelace", "--json"))
            assert {m["filename"] for m in found["mentions"]} == {"note.md"}
        document = succeeded_json(run_as_user(envs[1], "status", "--json"))["documents"][0]["document_key"]
        deleted = succeeded_json(run_as_user(envs[1], "delete", document, "--json"))
        assert deleted["document"] == document and deleted["points"] >= 1
        assert (
            succeeded_json(run_as_user(envs[0], "status", "--json"))["documents"][0]["graphrag_index_status"]
            == "completed"
        )
    finally:
        for env in envs:
            run_as_user(env, "db", "stop")
        shutil.rmtree(root, ignore_errors=True)


def succeeded_json(result: Result):
    return succeeded(result).json()
