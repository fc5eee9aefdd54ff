"""Fault-matrix row 7, a damaged graph store: while nothing runs, the Chunk bucket file of the embedded Bolt server's
database folder is deleted. `docqueue verify` names the folder in one sentence and exits 3; `docqueue repair --graph`
keeps the folder renamed, lets the server make a fresh one and re-queues the GraphRAG step of every completed chunk;
`docqueue run --until-idle` rewrites them. The graph's node and edge counts are those before the damage, nothing is
duplicated, the vector points are the same ones, and verify is clean again. Then the server is SIGKILLed (no
statistics.json, its write-ahead log kept) and an edge-list file deleted: verify names the folder, repair sets it aside,
the run rewrites the graph as it was. Last, schema.json is cut to nothing, and verify names the folder again (the other
damages, as files, are tests/integration/test_bolt_files.py's; bench/faults.py row 7 measures the rebuild).

The embedded server here is the test's own (DOCQUEUE_NEO4J_URI unset, its home under the test's DOCQUEUE_HOME), not
the session's shared one: it is stopped, damaged and restarted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests import pdf_factory as pf
from tests.cli_runner import docqueue
from tests.integration.bolt_fixture import free_port
from tests.integration.test_bolt_files import kill_server
from tests.reliability.conftest import Pipeline
from tests.reliability.support import Stores, document_statuses, figures_line, store_figures
from tests.reliability.test_damaged_stores import ALL_COMPLETED, close_everything


@pytest.fixture
def own_bolt(rel_env, monkeypatch):
    """The embedded Bolt server of the test's home, on a free port; stopped at the end."""
    from queue_db.config import Settings
    from resources.bolt_server import BoltServer

    monkeypatch.setenv("DOCQUEUE_NEO4J_URI", "")
    monkeypatch.delenv("DOCQUEUE_NEO4J_PASSWORD", raising=False)
    monkeypatch.delenv("DOCQUEUE_NEO4J_USER", raising=False)
    monkeypatch.delenv("DOCQUEUE_NEO4J_DATABASE", raising=False)
    monkeypatch.setenv("DOCQUEUE_BOLT_PORT", str(free_port()))
    server = BoltServer.from_settings(Settings.from_env())
    try:
        yield server
    finally:
        server.stop()


def damage(folder: Path, pattern: str, how: str) -> Path:
    target = sorted(folder.glob(pattern))[0]
    if how == "truncate":
        os.truncate(target, 0)
    else:
        target.unlink()
    return target


def _verify_names(folder: Path) -> float:
    """`docqueue verify --json` says the folder's one sentence and exits 3; returns how long it took."""
    started = time.monotonic()
    verify = docqueue("verify", "--json")
    detect_s = time.monotonic() - started
    assert verify.returncode == 3, (verify.returncode, verify.stdout[-2000:], verify.stderr[-2000:])
    sentence = verify.stderr.strip()
    assert sentence.startswith(f"docqueue: the graph database folder {folder} is damaged ("), sentence
    assert "\n" not in sentence and "Traceback" not in sentence, sentence
    assert json.loads(verify.stdout) == {
        "consistent": False,
        "damaged": sentence[len("docqueue: ") :],
        "folder": str(folder),
    }
    return detect_s


def test_a_damaged_graph_database_is_named_set_aside_and_rebuilt_from_the_queue(own_bolt, tmp_path, say):
    pipeline = Pipeline(tmp_path)
    try:
        topics = list(pf.TWO_TOPICS.values())
        docs = [pf.text_pdf(tmp_path, f"doc-{i}.pdf", [topics[i % 2], pf.DEMO_PAGE]) for i in (0, 1)]
        pipeline.ingest(docs)
        started = time.monotonic()
        pipeline.run_until_idle(max_seconds=120)
        clean_run_s = time.monotonic() - started
        assert set(document_statuses(pipeline.queue).values()) == {ALL_COMPLETED}, document_statuses(pipeline.queue)
        stores = Stores.open()
        before = store_figures(pipeline.queue, stores)
        points_before = stores.vector.chunk_ids()
        close_everything(stores)
        assert before["graph"]["chunks"] == before["chunks"] > 0 and before["graph"]["relationships"] > 0, before
        folder = own_bolt.database_folder
        own_bolt.stop()  # nothing runs when the damage happens
        damage(folder, "Chunk_0.*.bucket", "delete")
        detect_s = _verify_names(folder)
        started = time.monotonic()
        repaired = docqueue("repair", "--graph", "--json")
        repair_s = time.monotonic() - started
        assert repaired.returncode == 0, (repaired.stdout[-2000:], repaired.stderr[-2000:])
        result = json.loads(repaired.stdout)
        kept = Path(result["damaged_folder"]["kept_as"])
        assert kept.name.startswith(f"{folder.name}.damaged-") and (kept / "schema.json").is_file(), result
        assert result["requeued_graph_chunks"] == before["chunks"], result
        again = docqueue("repair", "--graph", "--json")
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["damaged_folder"] is None, again.stdout
        assert json.loads(again.stdout)["requeued_graph_chunks"] == 0, again.stdout
        with pipeline.queue.engine.connect() as conn:
            open_vector = conn.exec_driver_sql(
                "SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed'"
            ).scalar()
        assert open_vector == 0, "repair --graph re-queued vector work"
        started = time.monotonic()
        run = docqueue("run", "--until-idle", "--max-seconds", "150", timeout=240)
        run_s = time.monotonic() - started
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        assert set(document_statuses(pipeline.queue).values()) == {ALL_COMPLETED}
        stores = Stores.open()
        try:
            after = store_figures(pipeline.queue, stores)
            points_after = stores.vector.chunk_ids()
        finally:
            close_everything(stores)
        assert after["graph"] == before["graph"], (before["graph"], after["graph"])
        assert set(after["duplicates"].values()) == {0}, after["duplicates"]
        assert points_after == points_before and after["points"] == before["points"], "the vectors changed"
        assert after["verify"]["consistent"], after["verify"]
        final = docqueue("verify", "--json")
        assert final.returncode == 0 and json.loads(final.stdout)["consistent"], (final.stdout, final.stderr)

        # a SIGKILLed server: no statistics.json; ArcadeDB would skip the edges of the vertices whose list is gone
        kill_server(own_bolt)
        damage(folder, "Entity_0_out_edges.*", "delete")
        _verify_names(folder)
        killed = docqueue("repair", "--graph", "--json")
        assert killed.returncode == 0, (killed.stdout[-2000:], killed.stderr[-2000:])
        killed_result = json.loads(killed.stdout)
        assert killed_result["damaged_folder"] is not None, killed_result
        assert killed_result["requeued_graph_chunks"] == before["chunks"], killed_result
        run = docqueue("run", "--until-idle", "--max-seconds", "150", timeout=240)
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        stores = Stores.open()
        try:
            after_kill = store_figures(pipeline.queue, stores)
        finally:
            close_everything(stores)
        assert after_kill["graph"] == before["graph"], (before["graph"], after_kill["graph"])
        assert set(after_kill["duplicates"].values()) == {0}, after_kill["duplicates"]
        assert after_kill["verify"]["consistent"], after_kill["verify"]

        # a cut schema.json: ArcadeDB would load the previous schema, without the types made since, and read on
        own_bolt.stop()
        damage(folder, "schema.json", "truncate")
        _verify_names(folder)
        assert not own_bolt.is_running(), "the server started on a damaged folder"
        say(
            figures_line(
                "damaged graph database: deleted Chunk bucket",
                {
                    "faults": 1,
                    "tasks_lost": 0,
                    "duplicates": sum(after["duplicates"].values()),
                    "rebuilt_chunks": result["requeued_graph_chunks"],
                    "detect_s": round(detect_s, 1),
                    "repair_s": round(repair_s, 1),
                    "rebuild_s": round(run_s, 1),
                    "clean_run_s": round(clean_run_s, 1),
                },
            )
        )
    finally:
        pipeline.instance.dispose()


def _mention_figures(queue, graph) -> dict[str, tuple[str, int, int, int]]:
    """chunk id -> (queue row id, entities_extracted, MENTIONS edges, their weight) of every completed chunk."""
    weights = {c: n for page in graph.chunk_mention_pages(500) for c, n in page}
    edges = {
        row["id"]: row["n"]
        for row in graph._read("MATCH (c:Chunk) OPTIONAL MATCH (c)-[m:MENTIONS]->() RETURN c.id AS id, count(m) AS n")
    }
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT chunk_id, id::text, entities_extracted FROM task_queue_chunk WHERE graphrag_status = 'completed'"
        ).all()
    return {c: (row_id, extracted, edges[c], weights[c]) for c, row_id, extracted in rows}


def test_chunks_that_lost_mentions_are_named_requeued_and_rewritten(own_bolt, tmp_path, say):
    """Row 7's edge damage, done through the driver: the MENTIONS edges of two chunks (all of one's, one of the
    other's) are deleted. On the clean graph first, every completed chunk's mention weight is at least the entities
    its extraction gave (the relation verify relies on). `docqueue verify` names the folder and how many chunks lack
    mentions, exit 3; `docqueue repair --graph` sets the folder aside and re-queues every completed chunk, the run
    rewrites them, and the graph is as before, nothing doubled."""
    pipeline = Pipeline(tmp_path)
    try:
        topics = list(pf.TWO_TOPICS.values())
        docs = [pf.text_pdf(tmp_path, f"doc-{i}.pdf", [topics[i % 2], pf.DEMO_PAGE]) for i in (0, 1)]
        pipeline.ingest(docs)
        pipeline.run_until_idle(max_seconds=120)
        assert set(document_statuses(pipeline.queue).values()) == {ALL_COMPLETED}, document_statuses(pipeline.queue)
        stores = Stores.open()
        try:
            before = store_figures(pipeline.queue, stores)
            clean = _mention_figures(pipeline.queue, stores.graph)
            assert clean and all(weight >= extracted for _, extracted, _, weight in clean.values()), clean
            exact = [c for c, (_, extracted, edges, weight) in clean.items() if edges == extracted == weight > 0]
            assert len(exact) >= 2, clean
            all_of, one_of = exact[0], exact[1]
            stores.graph._write(
                lambda tx: tx.run("MATCH (:Chunk {id: $id})-[m:MENTIONS]->() DELETE m", id=all_of).consume()
            )
            stores.graph._write(
                lambda tx: tx.run(
                    "MATCH (:Chunk {id: $id})-[m:MENTIONS]->() WITH m LIMIT 1 DELETE m", id=one_of
                ).consume()
            )
        finally:
            close_everything(stores)
        folder = own_bolt.database_folder
        verify = docqueue("verify", "--json")
        assert verify.returncode == 3, (verify.returncode, verify.stdout[-2000:], verify.stderr[-2000:])
        sentence = verify.stderr.strip()
        assert sentence.startswith(
            f"docqueue: the graph database folder {folder} is damaged (2 completed chunk(s) lack entity mentions in it)"
        ), sentence
        assert "\n" not in sentence and "Traceback" not in sentence, sentence
        assert json.loads(verify.stdout)["folder"] == str(folder), verify.stdout
        repaired = docqueue("repair", "--graph", "--json")
        assert repaired.returncode == 0, (repaired.stdout[-2000:], repaired.stderr[-2000:])
        result = json.loads(repaired.stdout)
        # set aside whole, as the other damages: the edges a cut bucket lost are still named by their edge lists
        assert result["damaged_folder"] is not None and result["requeued_graph_chunks"] == len(clean), result
        started = time.monotonic()
        run = docqueue("run", "--until-idle", "--max-seconds", "150", timeout=240)
        rebuild_s = time.monotonic() - started
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        stores = Stores.open()
        try:
            after = store_figures(pipeline.queue, stores)
            assert _mention_figures(pipeline.queue, stores.graph) == clean
        finally:
            close_everything(stores)
        assert after["graph"] == before["graph"], (before["graph"], after["graph"])
        assert set(after["duplicates"].values()) == {0}, after["duplicates"]
        assert after["verify"]["consistent"], after["verify"]
        aliased = sum(edges < extracted for _, extracted, edges, _ in clean.values())
        say(
            figures_line(
                "damaged graph database: MENTIONS edges of two chunks deleted",
                {
                    "completed_chunks": len(clean),
                    "chunks_fewer_edges_than_entities": aliased,
                    "found": 2,
                    "rebuilt_chunks": result["requeued_graph_chunks"],
                    "rebuild_s": round(rebuild_s, 1),
                },
            )
        )
    finally:
        pipeline.instance.dispose()
