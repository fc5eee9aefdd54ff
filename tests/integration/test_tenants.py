"""Tenants on real services: PostgreSQL, the embedded Qdrant Edge store, a Bolt server and Dagster's instance.

The same file in two tenants is two documents; idempotency keys, search, the graph and status stay within their
tenant; `docqueue delete --tenant` removes one tenant from every store and leaves the other whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from queue_db.config import QueueSettings, Settings
from queue_db.phases import ALL_KINDS
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id

NOTE = (
    "# Harbour report\n\nLawrence Lessig met Ada Lovelace in Copenhagen to discuss the lighthouse budget. "
    "The Copenhagen harbour authority approved the lighthouse repairs for the winter season.\n"
)
OTHER = (
    "# Orchard notes\n\nMarie Curie planted apple trees near Uppsala. The Uppsala orchard gave a record "
    "harvest of apples this autumn.\n"
)


def cli(*args: str, ok: bool = True) -> dict | str:
    from orchestration.cli import main

    result = CliRunner().invoke(main, [*args, "--json"] if ok else list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code != 0
    return result.output


@pytest.fixture
def env(docqueue_env, tmp_path):
    engine = create_queue_engine(docqueue_env.queue_url)
    queue = TaskQueue(engine, QueueSettings())
    yield docqueue_env, queue, tmp_path
    engine.dispose()


def _process(queue: TaskQueue) -> None:
    """Every phase of every ready task, in the pipeline the workers run (no Dagster run needed here)."""
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline

    pipeline = Pipeline.from_settings(queue, Settings.from_env())
    worker = make_worker_id()
    try:
        for _ in range(20):
            if not any(queue.ready_counts().values()):
                return
            for kind in ALL_KINDS:
                claimed = queue.claim(kind, worker, 50)
                if claimed:
                    outcomes = process_tasks(pipeline, kind, worker, claimed)
                    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        raise AssertionError("work left after 20 rounds")
    finally:
        pipeline.close()


def _files(tmp_path: Path) -> tuple[Path, Path]:
    note, other = tmp_path / "harbour.md", tmp_path / "orchard.md"
    note.write_text(NOTE)
    other.write_text(OTHER)
    return note, other


def test_tenants_are_isolated_and_delete_tenant_removes_one_everywhere(env):
    docqueue_env, queue, tmp_path = env
    note, other = _files(tmp_path)

    # the same bytes in two tenants are two documents, each a duplicate of itself only within its tenant
    plain = cli("ingest", str(note), str(other))["results"]
    answer = cli("ingest", str(note), "--tenant", "acme")
    acme = answer["results"]
    assert answer["tenant"] == "acme"
    assert [r["status"] for r in plain] == ["new", "new"] and acme[0]["status"] == "new"
    assert acme[0]["document_id"] != plain[0]["document_id"]
    assert acme[0]["document_key"] == "acme--" + plain[0]["document_key"]
    assert cli("ingest", str(note), "--tenant", "acme")["results"][0]["status"] == "duplicate"

    _process(queue)

    # status: one tenant's documents only; without --tenant every tenant's
    acme_status = cli("status", "--tenant", "acme")["documents"]
    assert [d["document_key"] for d in acme_status] == [acme[0]["document_key"]]
    assert acme_status[0]["vector_index_status"] == "completed"
    assert {d["tenant_id"] for d in cli("status")["documents"]} == {"default", "acme"}
    counts = {
        tenant: {(r["task_type"], r["status"]): r["count"] for r in cli("stats", *args)["counts"]}
        for tenant, args in (("acme", ("--tenant", "acme")), ("all", ()))
    }
    assert counts["acme"][("vector_chunks", "completed")] == acme_status[0]["total_chunks"]
    assert counts["all"][("vector_chunks", "completed")] > counts["acme"][("vector_chunks", "completed")]

    # search: a tenant's points only (the default tenant's when no --tenant is given)
    acme_hits = cli("search", "apple orchard harvest", "--tenant", "acme", "--limit", "10")["hits"]
    assert acme_hits and {h["document_key"] for h in acme_hits} == {acme[0]["document_key"]}
    plain_hits = cli("search", "lighthouse budget", "--limit", "10")["hits"]
    assert plain_hits and {h["document_key"] for h in plain_hits} <= {r["document_key"] for r in plain}
    assert any(
        h["document_key"] == plain[1]["document_key"]
        for h in cli("search", "apple orchard harvest", "--limit", "10")["hits"]
    )

    # graph: each tenant has its own entity node; acme never sees the default tenant's Uppsala
    assert [m["document_id"] for m in cli("graph", "Copenhagen", "--tenant", "acme")["mentions"]] == [
        acme[0]["document_id"]
    ]
    assert {m["document_id"] for m in cli("graph", "Copenhagen")["mentions"]} == {plain[0]["document_id"]}
    assert cli("graph", "Uppsala")["mentions"]
    assert "no entity 'Uppsala' in the graph of tenant 'acme'" in cli("graph", "Uppsala", "--tenant", "acme", ok=False)

    # delete --tenant: every store loses acme, the default tenant keeps everything
    from orchestration.environment import dagster_instance
    from orchestration.store_cleanup import PARTITION_DEFS
    from queue_db.config import Settings
    from resources.graph_stores import Neo4jResource
    from resources.storage_resource import StorageResource

    def acme_in_graph() -> int:
        with Neo4jResource.from_settings(Settings.from_env()).get_store() as graph:
            return graph._read(
                "MATCH (n) WHERE n.tenant_id = 'acme' OR n.key STARTS WITH 'acme:' RETURN count(n) AS n"
            )[0]["n"]

    from orchestration.partitions import register_partitions
    from queue_db.phases import Level

    instance = dagster_instance(Settings.from_env())
    # ingest writes only the queue: the partitions come from the next sensor tick or `docqueue run`, as here
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    assert acme[0]["document_key"] in instance.get_dynamic_partitions(PARTITION_DEFS["documents"])
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    stored = {key: queue.document(key)["storage_key"] for key in (acme[0]["document_key"], plain[0]["document_key"])}
    assert stored[acme[0]["document_key"]].startswith("tenants/acme/documents/")
    assert all(map(storage.exists, stored.values())) and acme_in_graph() > 0
    removed = cli("delete", "--tenant", "acme")
    assert removed["documents"] == 1 and removed["points"] > 0 and removed["files"] >= 1
    assert cli("status", "--tenant", "acme")["documents"] == []
    assert not cli("search", "lighthouse budget", "--tenant", "acme")["hits"]
    partitions = instance.get_dynamic_partitions(PARTITION_DEFS["documents"])
    assert acme[0]["document_key"] not in partitions and plain[0]["document_key"] in partitions
    assert acme_in_graph() == 0
    assert not storage.exists(stored[acme[0]["document_key"]]), "acme's copy of the file is gone"
    assert storage.exists(stored[plain[0]["document_key"]]), "the default tenant's copy of the same bytes stays"
    assert len(cli("status")["documents"]) == 2
    assert plain[0]["document_key"] in {h["document_key"] for h in cli("search", "lighthouse budget")["hits"]}
    assert {m["document_id"] for m in cli("graph", "Copenhagen")["mentions"]} == {plain[0]["document_id"]}
    # idempotent: deleting it again finds nothing to do
    assert cli("delete", "--tenant", "acme")["documents"] == 0


def test_idempotency_key_and_refusals_are_per_tenant(env):
    _, queue, tmp_path = env
    note, other = _files(tmp_path)
    first = cli("ingest", str(note), "--idempotency-key", "req-1")["results"][0]
    # the same key in another tenant names another document, even for other bytes
    elsewhere = cli("ingest", str(other), "--idempotency-key", "req-1", "--tenant", "acme")["results"][0]
    assert elsewhere["status"] == "new" and elsewhere["document_id"] != first["document_id"]
    # within the tenant, the key with other bytes is still refused with one sentence
    refused = cli("ingest", str(note), "--idempotency-key", "req-1", "--tenant", "acme", ok=False)
    assert "already used for different content" in refused and "Traceback" not in refused

    # library API: the tenant is part of registration
    row, created = queue.register_document(filename="x.md", content_hash="ab" * 32, size_bytes=3, tenant="beta")
    again, created_again = queue.register_document(filename="x.md", content_hash="ab" * 32, size_bytes=3, tenant="beta")
    assert created and not created_again and again["id"] == row["id"] and row["tenant_id"] == "beta"


@pytest.mark.parametrize(
    "command", [["ingest", "README.md"], ["status"], ["stats"], ["search", "x"], ["graph", "x"], ["delete"]]
)
def test_a_bad_tenant_name_is_one_sentence(tmp_path, monkeypatch, command):
    # refused before any service is asked: no databases needed
    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path))
    output = cli(*command, "--tenant", "Acme Corp!", ok=False)
    assert "invalid tenant 'Acme Corp!': a tenant name is 1 to 63 characters" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1


def test_delete_tenant_refuses_while_its_tasks_run_and_resumes_after_an_interruption(env, monkeypatch):
    _, queue, _ = env
    from orchestration import store_cleanup
    from queue_db.phases import OCR_DOCUMENT

    docs = [
        queue.register_document(
            filename=f"n{i}.md", content_hash=f"{i:02d}" * 32, size_bytes=1, tenant="acme", mime_type="text/markdown"
        )[0]
        for i in range(5)
    ]
    kept, _ = queue.register_document(filename="k.md", content_hash="ff" * 32, size_bytes=1, mime_type="text/markdown")
    worker = make_worker_id()
    assert queue.claim(OCR_DOCUMENT, worker, 1, only_ids=[str(docs[0]["id"])])
    output = cli("delete", "--tenant", "acme", ok=False)
    assert "cannot delete tenant 'acme' now: 1 of its task(s) are running" in output
    assert len(output.strip().splitlines()) == 1
    assert len(cli("status", "--tenant", "acme")["documents"]) == 5, "nothing deleted while a task runs"
    queue.release_workers([worker])

    # batches of 2; the process dies while deleting the third document
    monkeypatch.setenv("DOCQUEUE_DELETE_BATCH", "2")
    real, calls = store_cleanup.delete_everywhere, []

    def dies_on_the_third(*args, **kwargs):
        calls.append(args[1]["document_key"])
        if len(calls) == 3:
            raise RuntimeError("storage went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(store_cleanup, "delete_everywhere", dies_on_the_third)
    assert "storage went away" in cli("delete", "--tenant", "acme", ok=False)
    assert len(cli("status", "--tenant", "acme")["documents"]) == 3, "whole documents only"
    monkeypatch.setattr(store_cleanup, "delete_everywhere", real)
    assert cli("delete", "--tenant", "acme")["documents"] == 3
    assert cli("status", "--tenant", "acme")["documents"] == []
    assert [d["document_key"] for d in cli("status")["documents"]] == [kept["document_key"]]


def test_short_forms_resolve_within_a_tenant_and_never_across(graph_store):
    from tests.integration.test_graph_store import chunk

    full = chunk(
        "a-book",
        1,
        0,
        [("Lawrence Lessig", "PERSON"), ("Stanford University", "ORG")],
        [("Lawrence Lessig", "Stanford University", "TEACH_AT")],
    )
    short = chunk("a-book", 1, 1, [("Lessig", "PERSON")])
    elsewhere = chunk("d-book", 1, 0, [("Lessig", "PERSON"), ("Stanford University", "ORG")])
    for written in (full, short):
        written.tenant_id = "acme"
    graph_store.write_chunks([short, elsewhere])
    graph_store.write_chunks([full])  # the full name arrives last: acme's short form moves to it

    acme = graph_store.entity("Lessig", tenant="acme")
    assert (acme["key"], acme["name"], acme["aliases"]) == ("acme:lawrence lessig", "Lawrence Lessig", ["lessig"])
    assert [(r["name"], r["rel_type"]) for r in acme["related"]] == [("Stanford University", "TEACH_AT")]
    assert {m["document_id"] for m in acme["mentions"]} == {"a-book"}
    plain = graph_store.entity("Lessig")
    assert (plain["key"], plain["aliases"], [m["document_id"] for m in plain["mentions"]]) == ("lessig", [], ["d-book"])
    assert graph_store.entity("Lawrence Lessig") is None
    assert graph_store.duplicate_entities() == []


def test_a_bad_default_tenant_setting_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path))
    monkeypatch.setenv("DOCQUEUE_DEFAULT_TENANT", "Bad Name")
    output = cli("search", "x", ok=False)
    assert output.strip() == (
        "docqueue: DOCQUEUE_DEFAULT_TENANT must be 1 to 63 characters of a-z, 0-9, `_` and "
        "`-`, starting with a letter or digit, got 'Bad Name'"
    )


NAMES = [
    "acme",
    "a",
    "0",
    "team_7-b",
    "x" * 63,
    "",
    "Acme",
    "-acme",
    "_acme",
    "x" * 64,
    "a b",
    "a:b",
    "acme\n",
    "ünï",
    "a/b",
]


def test_the_column_check_and_the_python_rule_agree_on_every_name(queue):
    """The tenant rule is stated twice (the CHECK of migration 0019 and queue_db/tenants.py): they must agree."""
    import sqlalchemy as sa

    from queue_db.keys import parse_partition_key
    from queue_db.tenants import tenant_document_key, tenant_problem

    doc, _ = queue.register_document(filename="t.md", content_hash="cd" * 32, size_bytes=1)
    for name in NAMES:
        try:
            with queue.engine.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE documents SET tenant_id = %(t)s WHERE id = %(d)s", {"t": name, "d": doc["id"]}
                )
            stored = True
        except sa.exc.IntegrityError:
            stored = False
        assert stored == (tenant_problem(name) is None), name
        if stored:  # a valid tenant's document keys are Dagster partition keys docqueue can parse back
            key = tenant_document_key(name, "report-1a2b3c4d")
            assert parse_partition_key(f"{key}/p0001/c002").document_key == key
