"""The `docqueue` command line, every command run as a subprocess against real services.

The first tests take a fresh `docqueue_env` each (bad input must leave an empty database empty). The rest share
one processed environment built once per module (`story`): ingest, a crashed worker recovered, one full
`run --until-idle --workers 2`. Read-only assertions come first; the tests that change the environment
(retry, a second run, breaking the stores for `verify`) come last, in file order.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from queue_db.migrate import available_migrations
from tests import pdf_factory as pf

DOCQUEUE = str(Path(sys.executable).with_name("docqueue"))
EXIT_TASKS_FAILED = 4
COMMAND_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
PASSWORD = "correct horse battery"


@dataclass
class Result:
    args: tuple[str, ...]
    code: int
    out: str
    err: str
    seconds: float

    def json(self):
        assert self.out.strip(), f"docqueue {' '.join(self.args)} printed nothing on stdout; stderr: {self.err}"
        lines = [line for line in self.out.splitlines() if line.strip()]
        assert len(lines) == 1, f"--json must print one document, got {len(lines)} lines:\n{self.out}"
        return json.loads(lines[0])


def docqueue(*args: str, env: dict | None = None, timeout: float = COMMAND_TIMEOUT_S) -> Result:
    started = time.monotonic()
    proc = subprocess.run(
        [DOCQUEUE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    return Result(args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def together(*commands: tuple[str, ...]) -> list[Result]:
    """Independent read-only commands at the same time (each is mostly interpreter start-up)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda args: docqueue(*args), commands))


def succeeded(result: Result) -> Result:
    assert result.code == 0, f"docqueue {' '.join(result.args)} exited {result.code}\n{result.out}\n{result.err}"
    assert "Traceback" not in result.err, result.err
    return result


def ok(*args: str, **kwargs) -> Result:
    return succeeded(docqueue(*args, **kwargs))


def ok_json(*args: str, **kwargs):
    return ok(*args, "--json", **kwargs).json()


def refused(result: Result, code: int | None = None) -> str:
    """The contract for errors: non-zero exit, one `docqueue: ...` sentence on stderr, no traceback."""
    assert result.code != 0, f"docqueue {' '.join(result.args)} succeeded:\n{result.out}"
    if code is not None:
        assert result.code == code, (result.code, result.err)
    assert "Traceback" not in result.err, result.err
    message = [line for line in result.err.splitlines() if line.startswith("docqueue: ")]
    assert message, f"no 'docqueue: ...' sentence on stderr:\n{result.err}"
    return " ".join(message)


def queue_engine(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


def rows(engine: sa.Engine, sql: str, **params) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(sql), params).mappings().all()]


def document(engine: sa.Engine, filename: str) -> dict:
    found = rows(engine, "SELECT * FROM documents WHERE filename = :f", f=filename)
    assert len(found) == 1, (filename, found)
    return found[0]


def queue_row_counts(engine: sa.Engine) -> dict[str, int]:
    return rows(
        engine,
        """SELECT (SELECT count(*) FROM documents) AS documents,
                                  (SELECT count(*) FROM task_queue_page) AS pages,
                                  (SELECT count(*) FROM task_queue_chunk) AS chunks""",
    )[0]


def all_phases(doc: dict) -> tuple[str, str, str]:
    return doc["ocr_status"], doc["vector_index_status"], doc["graphrag_index_status"]


COMPLETED = ("completed", "completed", "completed")


# ------------------------------------------------------------------------------------------ fresh environments
def test_db_upgrade_migrates_an_empty_database_once(docqueue_env, create_database):
    empty = {"DOCQUEUE_DATABASE_URL": create_database(prefix="empty")}
    every = [f"{m.version:04d}_{m.name}" for m in available_migrations()]

    first = ok_json("db", "upgrade", env=empty)
    assert first["applied"] == every and first["version"] == available_migrations()[-1].version
    again = ok("db", "upgrade", env=empty)
    assert "schema is up to date" in again.out
    assert ok_json("db", "upgrade", env=empty)["applied"] == []
    # nothing embedded runs under this DOCQUEUE_HOME (the test servers live elsewhere): nothing to stop
    assert ok_json("db", "stop") == {"postgres_stopped": False, "bolt_stopped": False}
    engine = queue_engine(empty["DOCQUEUE_DATABASE_URL"])
    try:
        assert rows(engine, "SELECT count(*) AS n FROM documents") == [{"n": 0}]
    finally:
        engine.dispose()


def _missing_file(tmp: Path) -> list[str]:
    return ["ingest", str(tmp / "nowhere.pdf")]


def _folder_without_documents(tmp: Path) -> list[str]:
    folder = tmp / "downloads"
    (folder / "nested").mkdir(parents=True)
    with zipfile.ZipFile(folder / "archive.zip", "w") as archive:
        archive.writestr("inside.txt", "an archive is not a document")
    (folder / "nested" / "data.bin").write_bytes(bytes(range(256)) * 8)
    return ["ingest", str(folder)]


def _empty_folder(tmp: Path) -> list[str]:
    (tmp / "empty").mkdir()
    return ["ingest", str(tmp / "empty")]


def _archive_named_pdf(tmp: Path) -> list[str]:
    with zipfile.ZipFile(tmp / "scan.pdf", "w") as archive:
        archive.writestr("page.txt", "a ZIP wearing a .pdf name")
    return ["ingest", str(tmp / "scan.pdf")]


def _missing_password_file(tmp: Path) -> list[str]:
    return ["ingest", str(pf.encrypted_pdf(tmp, "locked.pdf", PASSWORD)), "--password-file", str(tmp / "nope.txt")]


@pytest.mark.parametrize(
    "make_args, says",
    [
        (_missing_file, ["no such file", "nowhere.pdf"]),
        (_folder_without_documents, ["archive.zip (unsupported: a ZIP archive", "data.bin (unsupported"]),
        (_empty_folder, ["no files found"]),
        (_archive_named_pdf, ["scan.pdf (unsupported: a ZIP archive", "the content decides"]),
        (_missing_password_file, ["password file", "nope.txt"]),
        (lambda tmp: ["status", "no-such-document"], ["no document 'no-such-document'", "docqueue status"]),
        (lambda tmp: ["retry", "--phase", "ocr", "no-such-document"], ["no document 'no-such-document'"]),
        (lambda tmp: ["graph", "Nobody In Particular"], ["no entity 'Nobody In Particular'"]),
    ],
    ids=[
        "missing-file",
        "folder-without-documents",
        "empty-folder",
        "archive-named-pdf",
        "missing-password-file",
        "status-unknown-document",
        "retry-unknown-document",
        "graph-unknown-entity",
    ],
)
def test_bad_input_is_refused_with_a_sentence_and_nothing_is_written(docqueue_env, tmp_path, make_args, says):
    engine = queue_engine(docqueue_env.queue_url)
    try:
        before = queue_row_counts(engine)
        message = refused(docqueue(*make_args(tmp_path), "--json"))
        for fragment in says:
            assert fragment in message, message
        assert queue_row_counts(engine) == before == {"documents": 0, "pages": 0, "chunks": 0}
        assert not (docqueue_env.home / "storage" / "documents").exists()
    finally:
        engine.dispose()


def test_an_unreachable_database_is_one_sentence_without_the_password(docqueue_env, tmp_path):
    unreachable = {"DOCQUEUE_DATABASE_URL": "postgresql://postgres:hunter2@127.0.0.1:1/x"}
    pdf = pf.text_pdf(tmp_path, "fine.pdf", ["Nothing special."])
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(
            pool.map(
                lambda args: docqueue(*args, env=unreachable),
                [["status", "--json"], ["ingest", str(pdf)], ["db", "upgrade"]],
            )
        )
    for result in results:
        message = refused(result, code=1)
        assert "cannot connect to PostgreSQL" in message and "DOCQUEUE_DATABASE_URL" in message, message
        assert "hunter2" not in result.err


def test_ui_refuses_a_port_in_use(docqueue_env):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused(docqueue("ui", "--port", str(port), "--json"), code=2)
    assert f"port {port} on 127.0.0.1 is in use" in message and "--port" in message


def test_an_unreachable_graph_server_is_one_sentence_within_the_retry_budget(docqueue_env):
    result = docqueue(
        "graph",
        "anyone",
        env={
            "DOCQUEUE_NEO4J_URI": "bolt://127.0.0.1:1",
            "DOCQUEUE_NEO4J_PASSWORD": "hunter2",
            "DOCQUEUE_CLI_GRAPH_RETRY_S": "0.5",
        },
    )
    message = refused(result, code=1)
    assert "cannot use the graph store" in message and "DOCQUEUE_NEO4J_URI" in message, message
    assert "hunter2" not in result.err
    assert result.seconds < 60


def test_demo_processes_its_samples_end_to_end(docqueue_env):
    summary = ok_json("demo", timeout=RUN_TIMEOUT_S)
    assert summary["good_documents"] == summary["good_documents_completed"] == 3, summary["documents"]
    assert summary["phases"]["ocr"] == {"completed": 3, "failed": 1, "blocked": 0, "open": 0}
    # the broken file's later phases wait on its failed OCR: blocked, not pending forever
    assert (
        summary["phases"]["vector"]
        == summary["phases"]["graphrag"]
        == {"completed": 3, "failed": 0, "blocked": 1, "open": 0}
    )
    (broken,) = summary["broken"]
    assert broken["filename"] == "broken-upload.pdf" and "corrupt" in broken["error"]
    assert summary["chunks"] == summary["vectors"] > 0 and summary["entities"] > 0
    assert summary["search"]["hits"][0]["document"] == "harbour-report.pdf", summary["search"]
    engine = queue_engine(docqueue_env.queue_url)
    try:
        assert rows(engine, "SELECT count(*) AS n FROM documents")[0]["n"] == 4
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------------ one processed environment
@dataclass
class Story:
    tmp: Path
    env: dict[str, str]
    engine: sa.Engine
    files: dict[str, Path]
    ingests: list[dict] = field(default_factory=list)
    secret_ingest: Result | None = None
    recovered: dict | None = None
    after_recover: dict[str, dict] = field(default_factory=dict)
    run: dict | None = None
    run_refusal: str = ""
    run_seconds: float = 0.0


REPORT = [
    ["# Annual Report", "Ada Lovelace founded the Analytical Society in London with Charles Babbage."],
    ["## Finance", "Revenue grew in Paris and Berlin while the London office hired engineers."],
    # the surname comes first: its chunk may be written before the full name's
    ["## Law", "Professor Lessig met Jack Valenti in Washington to debate copyright terms."],
    ["## Culture", "Lawrence Lessig wrote a book about free culture at Stanford University."],
]


@pytest.fixture(scope="module")
def story(tmp_path_factory, create_database, migrated_template, bolt_server):
    """A module-scoped twin of conftest's `docqueue_env` (same variables, own databases, home and emptied graph),
    taken through ingest, a crashed worker's recovery and one full run with two workers."""
    from orchestration.environment import prepare_environment
    from queue_db.config import Settings
    from tests.integration.bolt_fixture import clean_graph

    tmp = tmp_path_factory.mktemp("cli")
    home = tmp / "home"
    env = {
        "DOCQUEUE_HOME": str(home),
        "DOCQUEUE_DATABASE_URL": create_database(template=migrated_template),
        "DOCQUEUE_DAGSTER_PG_URL": create_database(prefix="dagster"),
        "DAGSTER_HOME": str(home / "dagster"),
        "DOCQUEUE_NEO4J_URI": bolt_server.uri,
        "DOCQUEUE_NEO4J_USER": bolt_server.user,
        "DOCQUEUE_NEO4J_PASSWORD": bolt_server.password,
        "DOCQUEUE_QDRANT_PATH": str(home / "qdrant"),
        "DOCQUEUE_QDRANT_URL": "",
    }
    if bolt_server.database:
        env["DOCQUEUE_NEO4J_DATABASE"] = bolt_server.database
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        clean_graph(bolt_server)
        prepare_environment(Settings.from_env())
        engine = queue_engine(env["DOCQUEUE_DATABASE_URL"])
        try:
            yield _tell(Story(tmp, env, engine, _write_files(tmp)))
        finally:
            engine.dispose()


def _write_files(tmp: Path) -> dict[str, Path]:
    inbox = tmp / "inbox"
    inbox.mkdir()
    bees, volcanoes = pf.two_topic_pdfs(inbox)
    password_file = tmp / "password.txt"
    password_file.write_text(PASSWORD + "\n")
    return {
        "inbox": inbox,
        "bees": bees,
        "volcanoes": volcanoes,
        "report": pf.text_pdf(inbox, "report.pdf", REPORT),
        "broken": pf.truncated_pdf(tmp, "broken.pdf"),
        "secret": pf.encrypted_pdf(tmp, "secret.pdf", PASSWORD),
        "password": password_file,
    }


def _tell(story: Story) -> Story:
    from queue_db.config import Settings
    from queue_db.phases import OCR_DOCUMENT
    from resources.database import open_queue

    files = story.files
    ok("db", "upgrade")
    story.ingests.append(ok_json("ingest", str(files["inbox"])))
    story.ingests.append(ok_json("ingest", str(files["bees"]), str(files["broken"]), "--priority", "7"))
    story.secret_ingest = ok("ingest", str(files["secret"]), "--password-file", str(files["password"]))

    # a worker that claimed the report and died an hour ago, and one that is alive and well
    queue = open_queue(Settings.from_env())
    report, volcanoes = document(story.engine, "report.pdf"), document(story.engine, "volcanoes.pdf")
    assert queue.claim(OCR_DOCUMENT, "crashed-worker", only_ids=[str(report["id"])])
    assert queue.claim(OCR_DOCUMENT, "live-worker", only_ids=[str(volcanoes["id"])])
    with story.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE documents SET last_heartbeat = now() - interval '1 hour' WHERE id = :id"),
            {"id": report["id"]},
        )
    story.recovered = ok_json("recover", "--stale-after", "600")
    story.after_recover = {name: document(story.engine, name) for name in ("report.pdf", "volcanoes.pdf")}
    queue.release_workers(["live-worker"], "test: the live worker hands its task back")

    run = docqueue("run", "--until-idle", "--workers", "2", "--json", timeout=RUN_TIMEOUT_S)
    story.run_refusal = refused(run, code=EXIT_TASKS_FAILED)  # broken.pdf fails for good
    story.run, story.run_seconds = run.json(), run.seconds
    return story


GOOD = ("beekeeping.pdf", "volcanoes.pdf", "report.pdf", "secret.pdf")


def test_ingest_reports_new_and_duplicate_per_file(story):
    folder, again = story.ingests
    assert {Path(r["path"]).name: r["status"] for r in folder["results"]} == {
        "beekeeping.pdf": "new",
        "volcanoes.pdf": "new",
        "report.pdf": "new",
    }
    assert folder["counts"] == {"new": 3, "duplicate": 0, "rejected": 0}
    first_ids = {Path(r["path"]).name: r["document_id"] for r in folder["results"]}
    assert {Path(r["path"]).name: (r["status"], r["document_id"]) for r in again["results"]} == {
        "beekeeping.pdf": ("duplicate", first_ids["beekeeping.pdf"]),
        "broken.pdf": ("new", str(document(story.engine, "broken.pdf")["id"])),
    }
    for r in folder["results"] + again["results"]:
        assert r["document_key"].startswith(Path(r["path"]).stem + "-")
    assert rows(story.engine, "SELECT count(*) AS n FROM documents")[0]["n"] == 5


def test_ingest_priority_is_stored_and_a_duplicate_asked_for_more_urgently_is_raised(story):
    assert document(story.engine, "broken.pdf")["priority"] == 7
    assert document(story.engine, "beekeeping.pdf")["priority"] == 7  # ingested again with --priority 7


def test_priority_sets_a_documents_priority(story):
    volcanoes = document(story.engine, "volcanoes.pdf")
    result = ok_json("priority", volcanoes["document_key"], "9")
    assert result["priority"] == 9 and result["documents"] == 1
    assert document(story.engine, "volcanoes.pdf")["priority"] == 9
    out_of_range = docqueue("priority", volcanoes["document_key"], "11")
    assert out_of_range.code != 0 and "Traceback" not in out_of_range.err and "0<=x<=10" in out_of_range.err
    refused(docqueue("priority", "no-such-document", "3"))


def test_password_file_opens_the_encrypted_pdf_and_only_its_path_is_stored(story):
    from queue_db.config import Settings
    from resources.database import open_queue

    out = story.secret_ingest.out
    assert "secret.pdf" in out and "new" in out
    secret = document(story.engine, "secret.pdf")
    assert secret["password_ref"] == f"file:{story.files['password'].resolve()}"
    assert PASSWORD not in json.dumps(secret, default=str)
    assert all_phases(secret) == COMPLETED
    chunks = open_queue(Settings.from_env()).chunks(document_id=str(secret["id"]))
    text = " ".join(c["content"] for c in chunks)
    assert "salary review" in text


def test_recover_releases_only_the_stale_task(story):
    assert story.recovered["released_total"] == 1
    assert story.recovered["released"]["ocr_document"] == 1
    report, volcanoes = story.after_recover["report.pdf"], story.after_recover["volcanoes.pdf"]
    assert (report["ocr_status"], report["retry_count"], report["ocr_error_class"]) == ("pending", 1, "worker_lost")
    assert report["current_worker_id"] is None and "crashed-worker" in report["ocr_error"]
    assert (volcanoes["ocr_status"], volcanoes["current_worker_id"]) == ("processing", "live-worker")


def test_run_until_idle_with_two_workers_completes_the_good_files(story):
    assert story.run["runs"] >= 5 and story.run["failed_runs"] >= 1
    # forked from the run's process, which has imported what they run (orchestration.workers.ForkedWorker)
    assert story.run["workers"] == {"count": 2, "forked": True}
    for name in GOOD:
        assert all_phases(document(story.engine, name)) == COMPLETED, name
    progress = story.run["progress"]
    for phase in ("ocr", "vector", "graphrag"):
        assert progress[phase]["total"] > 0
    chunks = rows(story.engine, "SELECT count(*) AS n FROM task_queue_chunk")[0]["n"]
    assert progress["vector"] == progress["graphrag"] == {"total": chunks, "completed": chunks, "failed": 0}
    # the three ingests made three consecutive document blocks, so each worker owned at least one document
    workers = rows(
        story.engine,
        """SELECT current_worker_id AS w FROM documents
                                    UNION SELECT ocr_worker_id FROM task_queue_page
                                    UNION SELECT vector_worker_id FROM task_queue_chunk
                                    UNION SELECT graphrag_worker_id FROM task_queue_chunk""",
    )
    processes = {re.search(r":(\d+):[0-9a-f]{12}$", r["w"]).group(1) for r in workers if r["w"]}  # worker pid
    assert len(processes) == 2, workers  # both worker processes took part


def test_a_file_failed_for_good_does_not_keep_run_from_going_idle(story):
    broken = document(story.engine, "broken.pdf")
    assert broken["ocr_status"] == "failed" and "corrupt" in broken["ocr_error"]
    failed = rows(
        story.engine,
        """SELECT ocr_next_attempt_at AS next FROM task_queue_page
                                   WHERE document_id = :d AND ocr_status = 'failed'""",
        d=broken["id"],
    )
    if broken["pages_created_at"] is None:  # the file did not open at all
        failed = [{"next": broken["next_attempt_at"]}]
    assert failed and all(f["next"].year == 9999 for f in failed), failed  # never retried by itself
    assert story.run_seconds < RUN_TIMEOUT_S / 2  # it went idle; it did not wait out a time limit


def test_run_until_idle_summarises_the_failure_and_exits_with_its_own_code(story):
    summary = story.run["summary"]
    assert summary["failed"] == sum(summary["failed_by_error_class"].values()) >= 1
    assert summary["failed_by_error_class"].get("corrupt", 0) >= 1, summary
    assert summary["blocked_documents"] == 1  # broken.pdf: its vector phase waits behind its failed OCR
    assert summary["open"] == 0
    chunks = rows(story.engine, "SELECT count(*) AS n FROM task_queue_chunk")[0]["n"]
    assert summary["by_kind"]["graphrag_chunk"] == {"completed": chunks}
    assert "failed" in story.run_refusal and "docqueue retry" in story.run_refusal


def test_status_lists_every_document_and_one_by_key(story):
    report = document(story.engine, "report.pdf")
    every, single, table = (
        succeeded(r) for r in together(("status", "--json"), ("status", report["document_key"], "--json"), ("status",))
    )
    listed = every.json()["documents"]
    assert sorted(d["filename"] for d in listed) == sorted(GOOD + ("broken.pdf",))
    expected_keys = {
        "id",
        "document_key",
        "tenant_id",
        "filename",
        "priority",
        "ocr_status",
        "vector_index_status",
        "graphrag_index_status",
        "page_count",
        "total_pages",
        "ocr_completed_pages",
        "ocr_failed_pages",
        "total_chunks",
        "vector_completed_chunks",
        "graphrag_completed_chunks",
        "vector_failed_chunks",
        "graphrag_failed_chunks",
        "ocr_error",
        "vector_error",
        "graphrag_error",
        "error_class",
        "last_failed_at",
        "pages_without_text",
        "extraction_skipped",
        "engine",
        "blocked_phases",
        "content_group",
    }
    assert all(set(d) == expected_keys for d in listed), listed[0].keys()

    (one,) = single.json()["documents"]
    assert (one["id"], one["total_pages"], one["ocr_completed_pages"]) == (str(report["id"]), len(REPORT), len(REPORT))
    broken = next(d for d in listed if d["filename"] == "broken.pdf")
    assert broken["last_failed_at"]
    assert broken["blocked_phases"] == ["vector", "graphrag"] and one["blocked_phases"] == []
    assert one["total_chunks"] == one["vector_completed_chunks"] == one["graphrag_completed_chunks"] > 0

    table = table.out
    for d in listed:
        assert d["document_key"] in table
    assert "failed" in table and "completed" in table


def test_stats_counts_tasks_by_type_and_status(story):
    as_json, as_table = (succeeded(r) for r in together(("stats", "--json"), ("stats",)))
    stats = as_json.json()
    counts = {(r["task_type"], r["status"]): r["count"] for r in stats["counts"]}
    chunks = rows(story.engine, "SELECT count(*) AS n FROM task_queue_chunk")[0]["n"]
    assert counts[("vector_chunks", "completed")] == counts[("graphrag_chunks", "completed")] == chunks
    completed_pages = rows(story.engine, "SELECT count(*) AS n FROM task_queue_page WHERE ocr_status = 'completed'")
    assert counts[("ocr_pages", "completed")] == completed_pages[0]["n"]
    assert {r["task_type"] for r in stats["timings"]} >= {"ocr_pages", "vector_chunks", "graphrag_chunks"}
    assert any(r["error_class"] == "corrupt" for r in stats["error_classes"]), stats["error_classes"]

    assert "vector_chunks" in as_table.out and "wait median" in as_table.out
    # the story's runs measured every kind; what the planners size the next runs by is shown
    sizes = {r["task_type"]: r for r in stats["run_sizes"]}
    assert list(sizes) == ["ocr_document", "ocr_page", "vector_page", "vector_chunk", "graphrag_chunk"]
    for size in sizes.values():
        assert size["runs"] >= 1 and size["key_s"] > 0 and size["overhead_s"] >= 0, size
        assert 1 <= size["keys_per_run"] <= size["max_keys"], size
    assert "run sizes" in as_table.out and "keys a run" in as_table.out


def test_verify_passes_on_a_consistent_environment(story):
    report = ok_json("verify")
    chunks = rows(story.engine, "SELECT count(*) AS n FROM task_queue_chunk")[0]["n"]
    assert report["consistent"] is True
    assert report["completed_vector_chunks"] == report["points"] == report["completed_graph_chunks"] == chunks


def test_search_finds_the_document_on_the_topic(story):
    bees_query, volcano_query = "how do beekeepers get honey out of the combs", "lava and ash from an erupting mountain"
    bees, volcanoes = (
        succeeded(r)
        for r in together(("search", bees_query, "--limit", "3", "--json"), ("search", volcano_query, "--limit", "1"))
    )
    found = bees.json()
    assert found["query"] == bees_query and 1 <= len(found["hits"]) <= 3
    top = found["hits"][0]
    assert top["document"] == "beekeeping.pdf", found["hits"]
    assert top["document_key"] == document(story.engine, "beekeeping.pdf")["document_key"]
    assert top["page"] == 1 and "honey" in top["text"]
    assert "volcanoes.pdf" in volcanoes.out and "beekeeping.pdf" not in volcanoes.out  # the table of the top hit


def test_graph_shows_an_entity_its_mentions_and_related_entities(story):
    as_json, as_page = (succeeded(r) for r in together(("graph", "ada lovelace", "--json"), ("graph", "ADA LOVELACE")))
    found = as_json.json()
    assert found["name"] == "Ada Lovelace" and found["type"]
    assert {(m["filename"], m["page_number"]) for m in found["mentions"]} == {("report.pdf", 1)}
    related = {r["name"] for r in found["related"]}
    assert "London" in related, found["related"]
    assert all(r["direction"] in ("in", "out") and r["rel_type"] for r in found["related"])

    page = as_page.out
    assert "Ada Lovelace" in page and "report.pdf" in page and "London" in page


def test_graph_finds_a_person_by_the_surname_the_document_also_uses(story):
    found = ok_json("graph", "lessig")
    assert (found["name"], found["type"], found["aliases"]) == ("Lawrence Lessig", "PERSON", ["lessig"])
    assert {(m["filename"], m["page_number"]) for m in found["mentions"]} == {("report.pdf", 3), ("report.pdf", 4)}
    assert {"Jack Valenti", "Stanford University"} <= {r["name"] for r in found["related"]}, found["related"]
    assert ok_json("graph", "Lawrence Lessig") == found


# -- from here on the tests change the environment (file order matters) ------------------------------------------
def test_retry_puts_a_failed_task_back_to_pending(story):
    broken = document(story.engine, "broken.pdf")
    before = rows(
        story.engine,
        "SELECT count(*) AS n FROM task_queue_page WHERE document_id = :d AND ocr_status = 'failed'",
        d=broken["id"],
    )[0]["n"]
    retried = ok_json("retry", "--phase", "ocr", broken["document_key"])
    assert retried["total"] == retried["retried"]["ocr_document"] + retried["retried"].get("ocr_page", 0) >= 1
    again = document(story.engine, "broken.pdf")
    failed_pages = rows(
        story.engine,
        "SELECT count(*) AS n FROM task_queue_page WHERE document_id = :d AND ocr_status = 'failed'",
        d=broken["id"],
    )[0]["n"]
    if before:
        assert failed_pages == 0
    else:
        assert (again["ocr_status"], again["retry_count"]) == ("pending", 0)
    assert document(story.engine, "report.pdf")["ocr_status"] == "completed"  # only the failed one moved


def test_run_until_idle_processes_new_work_and_fails_the_retried_file_again(story):
    extra = pf.text_pdf(story.tmp, "operations.pdf", [pf.DEMO_PAGE])
    (result,) = ok_json("ingest", str(extra))["results"]
    assert result["status"] == "new"
    run = docqueue("run", "--until-idle", timeout=RUN_TIMEOUT_S)
    refused(run, code=EXIT_TASKS_FAILED)
    summary = run.out
    assert "run(s)" in summary and "graphrag:" in summary and "summary: " in summary and "corrupt: 1" in summary
    assert all_phases(document(story.engine, "operations.pdf")) == COMPLETED
    assert document(story.engine, "broken.pdf")["ocr_status"] == "failed"


def test_verify_fails_when_a_point_or_a_graph_chunk_is_missing(story):
    from queue_db.config import Settings
    from resources.embeddings import DEFAULT_MODEL, MODELS
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource

    chunk_ids = [r["chunk_id"] for r in rows(story.engine, "SELECT chunk_id FROM task_queue_chunk ORDER BY chunk_id")]
    vector_resource = QdrantResource.from_settings(Settings.from_env())
    with vector_resource.get_store(DEFAULT_MODEL, MODELS[DEFAULT_MODEL].dim) as vectors:
        vectors.delete_chunks([chunk_ids[0]])
    with Neo4jResource.from_settings(Settings.from_env()).get_store() as graph:
        graph.delete_chunks([chunk_ids[-1]])

    as_json, as_table = together(("verify", "--json"), ("verify",))
    message = refused(as_json, code=3)
    assert "inconsistent" in message and "docqueue recover" in message
    report = as_json.json()
    assert (report["consistent"], report["chunks_without_point"], report["chunks_without_graph"]) == (False, 1, 1)
    assert report["points"] == len(chunk_ids) - 1
    refused(as_table, code=3)
    assert re.search(r"consistent\s*│\s*False", as_table.out)
    assert re.search(r"chunks_without_point\s*│\s*1", as_table.out)


def test_db_upgrade_sql_needs_no_database_and_db_status_reads_what_it_applied(docqueue_env, create_database):
    import psycopg

    unreachable = {"DOCQUEUE_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    script = ok("db", "upgrade", "--sql", env=unreachable).out
    assert script.count("INSERT INTO docqueue_schema_version") == len(available_migrations())
    later = ok("db", "upgrade", "--sql", "--from", str(available_migrations()[-2].version), env=unreachable).out
    assert later.count("INSERT INTO docqueue_schema_version") == 1

    fresh = create_database()
    env = {"DOCQUEUE_DATABASE_URL": fresh}
    before = docqueue("db", "status", "--json", env=env)
    assert before.code == 1 and len(before.json()["queue"]["pending"]) == len(available_migrations())
    with psycopg.connect(fresh, autocommit=True) as conn:  # what a DBA does with the script
        conn.execute(script)
    after = docqueue("db", "status", "--json", env=env)
    assert after.json()["queue"]["pending"] == [], after.out + after.err
    assert "Traceback" not in after.err
