"""Security: parameterised SQL (hostile names, metadata and errors stored and shown verbatim), intake confined to
the inbox, secrets kept out of logs, run metadata and error messages, services listening on 127.0.0.1 only."""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pymupdf
import pytest

from queue_db.phases import OCR_DOCUMENT
from queue_db.queue import make_worker_id
from tests import pdf_factory as pf
from tests.reliability.support import REPO_ROOT, wait_for

HOSTILE_NAMES = [
    os.fsencode("a'b\";DROP TABLE documents;-- ") + b"\xff\xfe latin1 \xe9t\xe9.pdf",  # not UTF-8
    os.fsencode("x'); DELETE FROM task_queue_page; --.pdf"),
    os.fsencode("名前 'quoted' %s %(x)s $1 \\N.pdf"),
]
HOSTILE_TEXT = "T'; DROP TABLE documents;-- \" \\ %s $1 \x00 end"


def _cli(*args: str | bytes, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _hostile_pdf(folder: Path, name: bytes, number: int) -> Path:
    path = Path(os.fsdecode(os.path.join(os.fsencode(folder), name)))
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), f"Hostile name document number {number}.", fontsize=12)
    doc.set_metadata({"title": HOSTILE_TEXT, "author": "O'Brien; --"})
    with open(os.fsencode(path), "wb") as handle:  # the name's bytes as they are (not UTF-8)
        handle.write(doc.tobytes())
    doc.close()
    return path


def _table_counts(queue) -> tuple[int, int, int]:
    with queue.engine.connect() as conn:
        return tuple(
            conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar()
            for t in ("documents", "task_queue_page", "task_queue_chunk")
        )


def test_hostile_names_metadata_and_errors_are_stored_and_shown_verbatim(pipeline, tmp_path, monkeypatch):
    folder = tmp_path / "hostile"
    folder.mkdir()
    paths = [_hostile_pdf(folder, name, i) for i, name in enumerate(HOSTILE_NAMES)]
    results = pipeline.ingest(paths[:2])
    # an error message made of hostile text: a password reference naming a variable that is not set
    bad_ref = "env:X'; DROP TABLE documents;-- \""
    results += pipeline.ingest(paths[2:], password_ref=bad_ref)
    assert [r.status for r in results] == ["new", "new", "new"], results
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline as Work
    from queue_db.config import Settings
    from queue_db.phases import OCR_PAGE
    from resources.ocr_resource import OcrResource

    worker = make_worker_id("hostile")

    work = Work(
        pipeline.queue, storage=pipeline.storage, pdf=OcrResource.from_settings(Settings.from_env()).get_processor()
    )
    try:
        outcomes = process_tasks(work, OCR_DOCUMENT, worker, pipeline.queue.claim(OCR_DOCUMENT, worker, 10))
    finally:
        work.close()
    assert [o.ok for o in outcomes] == [True, True, False]
    # and a queue error holding a NUL and an undecodable byte, straight through the queue API
    page = pipeline.queue.pages(results[0].document_id)[0]
    page_worker = make_worker_id("nul")
    assert pipeline.queue.claim(OCR_PAGE, page_worker, 1, only_ids=[page["id"]])
    nasty_error = "bad \x00 byte \udcff and '; DROP TABLE task_queue_page;--"
    assert pipeline.queue.fail(
        OCR_PAGE, page_worker, [{"id": page["id"], "error": nasty_error, "retryable": False}]
    ).applied

    status = _cli("status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    shown = {d["id"]: d for d in json.loads(status.stdout)["documents"]}
    for path, result in zip(paths, results):
        raw = os.fsencode(path.name)
        document = pipeline.queue.document(result.document_id)
        assert bytes(document["filename_bytes"]) == raw  # the exact bytes, kept
        # shown: every character as given; an undecodable byte as a visible \xNN escape
        expected = raw.decode("utf-8", "backslashreplace")
        assert document["filename"] == expected and shown[result.document_id]["filename"] == expected
    for path, result in zip(paths[:2], results[:2]):
        metadata = pipeline.queue.document(result.document_id)["metadata"]["pdf"]
        with open(os.fsencode(path), "rb") as handle:
            read = pymupdf.open(stream=handle.read()).metadata  # what the file says, as PyMuPDF decodes it
        # PostgreSQL text and jsonb cannot hold NUL: it is the one character dropped from metadata
        assert metadata["title"] == read["title"].replace("\x00", "").strip()
        assert "'; DROP TABLE documents;-- \" \\ %s $1" in metadata["title"] and metadata["author"] == "O'Brien; --"
    assert shown[results[2].document_id]["ocr_error"] == f"encrypted: password variable {bad_ref[4:]} is not set"
    with pipeline.queue.engine.connect() as conn:
        stored = conn.exec_driver_sql(
            "SELECT ocr_error FROM task_queue_page WHERE id = %(i)s", {"i": page["id"]}
        ).scalar()
    assert stored == "bad \\x00 byte \\xff and '; DROP TABLE task_queue_page;--"
    assert shown[results[0].document_id]["ocr_error"] == "page 1: " + stored
    assert pipeline.queue.document("x' OR '1'='1") is None  # a hostile lookup finds nothing, not everything
    assert _table_counts(pipeline.queue) == (3, 2, 0)  # every table still there, nothing deleted


def test_intake_stays_inside_the_inbox_and_never_overwrites_a_document(pipeline, tmp_path, monkeypatch):
    import dagster as dg

    from orchestration.sensors import inbox_sensor
    from queue_db.config import Settings
    from resources.database import DatabaseResource
    from resources.storage_resource import StorageResource

    inbox, outside = tmp_path / "inbox", tmp_path / "outside"
    (inbox / "a").mkdir(parents=True)
    (inbox / "b").mkdir()
    outside.mkdir()
    secret = pf.text_pdf(outside, "secret.pdf", ["# Outside", "This file lives outside the inbox."])
    pf.text_pdf(outside, "other.pdf", ["# Outside too", "Another file outside the inbox."])
    first = pf.text_pdf(inbox / "a", "report.pdf", ["# Report A", "The first report with its own words."])
    second = pf.text_pdf(inbox / "b", "report.pdf", ["# Report B", "A second report, same name, other words."])
    (inbox / "link-to-secret.pdf").symlink_to(secret)
    (inbox / "linked-folder").symlink_to(outside, target_is_directory=True)
    originals = {p: p.read_bytes() for p in (first, second, secret)}

    monkeypatch.setenv("DOCQUEUE_INBOX", str(inbox))
    context = dg.build_sensor_context(
        instance=pipeline.instance,
        resources={
            "database": DatabaseResource.from_settings(Settings.from_env()),
            "storage": StorageResource.from_settings(Settings.from_env()),
        },
    )
    message = inbox_sensor(Settings.from_env()).evaluate_tick(context).skip_message
    results = pipeline.ingest(
        [inbox, inbox / ".." / "outside" / "secret.pdf", inbox / "link-to-secret.pdf", inbox / "linked-folder"],
        root=inbox,
    )
    with pipeline.queue.engine.connect() as conn:
        registered = conn.exec_driver_sql("SELECT source_path, storage_key FROM documents ORDER BY source_path").all()
    assert [r[0] for r in registered] == [str(first.resolve()), str(second.resolve())], (message, registered)
    assert {r.status for r in results} == {"duplicate"}  # the sensor took both; nothing else came in
    # two files named report.pdf: two documents, two stored files, each still holding its own bytes
    assert len({r[1] for r in registered}) == 2
    for (source, key), original in zip(registered, (originals[first], originals[second])):
        assert pipeline.storage.local_path(key).read_bytes() == original
    assert all(p.read_bytes() == b for p, b in originals.items())
    for hostile_key in ("../outside/secret.pdf", "/etc/passwd", "documents/../../x"):
        with pytest.raises(ValueError):
            pipeline.storage.put_text(hostile_key, "x")


class _LeakyLlm(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that refuses every key and quotes it back, deep in a long error body."""

    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # the key starts at character 290: a client that cuts the body at 300 before redacting leaks its start
        prefix = '{"error": {"message": "'
        filler = "x" * (290 - len(prefix) - len(" rejected Bearer "))
        body = json.dumps({"error": {"message": filler + " rejected " + self.headers.get("Authorization", "")}})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def _with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://postgres:{password}@{rest.split('@', 1)[-1]}"


def test_secrets_never_reach_logs_run_metadata_or_errors(rel_env, tmp_path, monkeypatch):
    from dagster._serdes import serialize_value

    db_secret, neo4j_secret = "PgPlanted-8c1f-Secret", "Neo4jPlanted-51d2-Secret"
    llm_secret = "sk-LlmPlanted-e7a9-Secret"
    secrets = {
        "db": db_secret,
        "neo4j": neo4j_secret,
        "llm": llm_secret,
        "llm-prefix": llm_secret[:12],
        "bolt": rel_env.bolt.password,
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LeakyLlm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # the embedded server trusts local connections, so a planted password changes nothing but what could leak
    for name, value in {
        "DOCQUEUE_DATABASE_URL": _with_password(rel_env.queue_url, db_secret),
        "DOCQUEUE_DAGSTER_PG_URL": _with_password(rel_env.dagster_url, db_secret),
        "DOCQUEUE_EXTRACTOR": "llm",
        "DOCQUEUE_LLM_BASE_URL": f"http://127.0.0.1:{server.server_port}/v1",
        "DOCQUEUE_LLM_MODEL": "leaky",
        "DOCQUEUE_LLM_API_KEY": llm_secret,
        "DOCQUEUE_LLM_MAX_RETRIES": "0",
        "MAX_TASK_RETRIES": "1",
    }.items():
        monkeypatch.setenv(name, value)
    from tests.reliability.conftest import Pipeline

    pipeline = Pipeline(tmp_path)  # on the URLs holding the planted password
    pipeline.ingest([pf.text_pdf(tmp_path, "memo.pdf", [pf.DEMO_PAGE])])
    outputs = []
    try:
        # the pipeline through the CLI: OCR and vectors complete, the graph phase fails at the leaky endpoint
        ran = _cli("run", "--until-idle", "--json")
        outputs.append(ran)
        assert ran.returncode == 4, ran.stderr[-2000:]  # exit 4: tasks ended failed
        llm_errors = {c["graphrag_error"] for c in pipeline.queue.chunks()}
        # a failing graph server login with a planted password
        monkeypatch.setenv("DOCQUEUE_EXTRACTOR", "spacy")
        monkeypatch.setenv("DOCQUEUE_NEO4J_PASSWORD", neo4j_secret)
        pipeline.reload_settings()  # the definitions carry the extractor and the graph's password
        assert sum(pipeline.queue.retry_failed().values()) >= 1
        pipeline.run_until_idle()
        graph_errors = {c["graphrag_error"] for c in pipeline.queue.chunks()}
        outputs += [
            _cli("status", "--json"),
            _cli("verify", "--json"),
            _cli("status", "--json", env={"DOCQUEUE_DATABASE_URL": f"postgresql://u:{db_secret}@127.0.0.1:1/x"}),
        ]
    finally:
        server.shutdown()
    assert {(c["vector_status"], c["graphrag_status"]) for c in pipeline.queue.chunks()} == {("completed", "failed")}
    assert all("HTTP 401" in e and "***" in e for e in llm_errors), llm_errors  # the failures really happened
    assert all("Unauthorized" in e or "AuthError" in e for e in graph_errors), graph_errors
    assert outputs[-1].returncode != 0 and b"cannot connect to PostgreSQL" in outputs[-1].stderr
    assert outputs[-2].returncode != 0  # verify cannot log in to the graph server

    places: dict[str, bytes] = {
        f"cli {i} {stream}": getattr(out, stream) for i, out in enumerate(outputs) for stream in ("stdout", "stderr")
    }
    with pipeline.queue.engine.connect() as conn:
        for table in ("documents", "task_queue_page", "task_queue_chunk"):
            places[f"queue {table}"] = "\n".join(
                r[0] for r in conn.exec_driver_sql(f"SELECT row_to_json(t)::text FROM {table} t").all()
            ).encode()
    runs = pipeline.instance.get_runs()
    assert len(runs) >= 8
    for run in runs:
        places[f"run {run.run_id}"] = serialize_value(run).encode()
        events = pipeline.instance.all_logs(run.run_id)
        places[f"events {run.run_id}"] = "\n".join(serialize_value(e) for e in events).encode()
    for path in Path(os.environ["DAGSTER_HOME"]).rglob("*"):
        if path.is_file():
            places[f"file {path}"] = path.read_bytes()
    leaks = [
        (secret_name, place)
        for place, content in places.items()
        for secret_name, secret in secrets.items()
        if secret.encode() in content
    ]
    assert not leaks, leaks
    pipeline.instance.dispose()


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    return [
        (c.pid, c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]


def _loopback(ip: str) -> bool:
    """127.0.0.1, ::1, or the JVM's IPv4-mapped form ::ffff:127.0.0.1; never 0.0.0.0 / :: / a real interface."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _tree(pid: int) -> set[int]:
    try:
        process = psutil.Process(pid)
        return {pid, *(child.pid for child in process.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def test_started_services_listen_on_loopback_only(rel_env, pg_admin_url, say):
    from urllib.parse import urlsplit

    def owner_of(port: int) -> int:
        return next(
            c.pid
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        )

    found = {
        "postgres": _listening(_tree(owner_of(urlsplit(pg_admin_url).port))),
        "bolt": _listening(_tree(owner_of(urlsplit(rel_env.bolt.uri).port))),
    }
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ui = subprocess.Popen(
        [sys.executable, "-m", "orchestration.cli", "ui", "--port", str(port), "--json"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: any(
                c.laddr.port == port for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
            ),
            240,
            0.5,
            "the Dagster webserver to listen",
        )
        time.sleep(2)  # the daemon and code server come up beside it
        found["webserver, daemon, code server"] = _listening(_tree(ui.pid))
    finally:
        ui.send_signal(signal.SIGTERM)  # `docqueue ui` stops dagster dev in order
        try:
            ui.wait(60)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait()
    for service, sockets in found.items():
        assert sockets, f"{service}: no listening socket found"
        assert all(_loopback(ip) for _, ip, _ in sockets), (service, sockets)
    say(
        "[reliability] listening sockets: "
        + "; ".join(
            f"{service}: " + ", ".join(sorted({f"{ip}:{port}" for _, ip, port in sockets}))
            for service, sockets in found.items()
        )
    )
