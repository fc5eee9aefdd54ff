"""GraphStore against a real Bolt server (embedded ArcadeDB, official neo4j driver): idempotence, concurrency,
entity identity, deletes; plus the BoltServer lifecycle (races, restart, credentials, loopback only)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processing.entities import ChunkGraph, Entity, Extraction, Relation, normalize_entity_name
from queue_db.config import Settings
from resources.bolt_graph import GraphStore
from resources.bolt_server import BoltServer
from resources.graph_stores import Neo4jResource
from tests.integration.bolt_fixture import free_port

REPO = Path(__file__).resolve().parents[2]


def chunk(
    document_id: str,
    page: int,
    index: int,
    entities: list[tuple[str, str]],
    relations: list[tuple[str, str, str]] = (),
    chunk_id: str | None = None,
) -> ChunkGraph:
    return ChunkGraph(
        document_id=document_id,
        filename=f"{document_id}.pdf",
        page_number=page,
        chunk_id=chunk_id or f"{document_id}:{page}:{index}",
        chunk_index=index,
        extraction=Extraction(
            [Entity(name, type_) for name, type_ in entities],
            [Relation(normalize_entity_name(s), normalize_entity_name(t), ty) for s, t, ty in relations],
        ),
    )


def corpus_of_chunks(n_docs: int = 3, chunks_per_doc: int = 12) -> list[ChunkGraph]:
    """Overlapping entities across chunks and documents, so merges and weights are exercised."""
    people = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Tim Berners-Lee", "Barbara Liskov"]
    orgs = ["IBM", "CERN", "Bletchley Park", "MIT", "Royal Society"]
    out = []
    for d in range(n_docs):
        for i in range(chunks_per_doc):
            person, org = people[(d + i) % len(people)], orgs[(d * 2 + i) % len(orgs)]
            other = people[(d + i + 1) % len(people)]
            out.append(
                chunk(
                    f"doc{d}",
                    1 + i // 4,
                    i,
                    [(person, "PERSON"), (org, "ORG"), (other, "PERSON"), (f"Topic {i % 7}", "WORK_OF_ART")],
                    [(person, org, "WORK_AT"), (person, other, "CO_OCCURS"), (other, org, "CO_OCCURS")],
                )
            )
    return out


def relationship_weights(store: GraphStore) -> dict[tuple[str, str, str], tuple[int, list[str]]]:
    rows = store._read(
        "MATCH (a:Entity)-[r:RELATED_TO]->(b:Entity) "
        "RETURN a.key AS a, b.key AS b, r.type AS t, r.weight AS w, r.chunk_ids AS ids"
    )
    return {(r["a"], r["b"], r["t"]): (r["w"], sorted(r["ids"])) for r in rows}


# -- idempotence ---------------------------------------------------------------------------------------------------
def test_rewriting_the_same_chunks_changes_nothing(graph_store):
    chunks = corpus_of_chunks()
    written = graph_store.write_chunks(chunks)
    first_counts, first_weights = graph_store.counts(), relationship_weights(graph_store)
    assert first_counts["documents"] == 3 and first_counts["chunks"] == len(chunks)
    assert written == (first_counts["entities"], first_counts["relationships"])

    assert graph_store.write_chunks(chunks) == written
    graph_store.write_chunks(list(reversed(chunks))[:10])
    assert graph_store.counts() == first_counts
    assert relationship_weights(graph_store) == first_weights
    # weight is the number of distinct chunks stating the relation
    for weight, ids in first_weights.values():
        assert weight == len(ids) == len(set(ids))
    assert graph_store.duplicate_entities() == []


def test_batches_smaller_than_the_input_give_the_same_graph(graph_store, bolt_server):
    chunks = corpus_of_chunks()
    graph_store.write_chunks(chunks)
    expected = graph_store.counts(), relationship_weights(graph_store)
    from tests.integration.bolt_fixture import clean_graph

    clean_graph(bolt_server)
    with bolt_server.store(batch_size=7) as small_batches:
        small_batches.write_chunks(chunks)
        assert (small_batches.counts(), relationship_weights(small_batches)) == expected


def test_concurrent_writers_of_the_same_chunks_leave_one_graph(graph_store, bolt_server):
    chunks = corpus_of_chunks(n_docs=2, chunks_per_doc=10)
    with bolt_server.store() as reference:
        reference.write_chunks(chunks)
        expected = reference.counts(), relationship_weights(reference)
    from tests.integration.bolt_fixture import clean_graph

    clean_graph(bolt_server)

    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def writer(order: list[ChunkGraph]) -> None:
        try:
            with bolt_server.store(batch_size=5) as store:
                start.wait()
                store.write_chunks(order)
        except BaseException as exc:  # reported below, with the other thread's outcome
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(chunks,)),
        threading.Thread(target=writer, args=(list(reversed(chunks)),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert graph_store.duplicate_entities() == []
    assert (graph_store.counts(), relationship_weights(graph_store)) == expected


# -- entity identity -------------------------------------------------------------------------------------------------
def test_case_whitespace_and_punctuation_variants_are_one_entity(graph_store):
    variants = ["Apple Inc.", "APPLE INC", "apple  inc", " Apple Inc ", "Apple, Inc.", "Ａｐｐｌｅ Inc"]
    graph_store.write_chunks(
        [
            chunk("d", 1, i, [(name, "ORG"), ("Tim Cook", "PERSON")], [("Tim Cook", name, "LEAD")])
            for i, name in enumerate(variants)
        ]
    )
    assert graph_store.counts()["entities"] == 2
    assert graph_store.duplicate_entities() == []
    apple = graph_store.entity("apple inc")
    assert apple["key"] == "apple inc" and apple["name"] == "Apple Inc."
    assert apple["related"] == [
        {"name": "Tim Cook", "type": "PERSON", "rel_type": "LEAD", "weight": len(variants), "direction": "in"}
    ]


def test_uniqueness_is_enforced_by_the_server(graph_store):
    import neo4j.exceptions

    graph_store.write_chunks([chunk("d", 1, 0, [("Apple", "ORG")])])
    with pytest.raises(neo4j.exceptions.ConstraintError):
        graph_store._write(lambda tx: tx.run("CREATE (:Entity {key: 'apple', name: 'dup'})").consume())


def test_entity_lookup_reports_mentions_and_both_directions(graph_store):
    graph_store.write_chunks(
        [
            chunk("report", 2, 0, [("Marie Curie", "PERSON"), ("Paris", "GPE")], [("Marie Curie", "Paris", "WORK_IN")]),
            chunk(
                "report",
                5,
                1,
                [("Marie Curie", "PERSON"), ("Pierre Curie", "PERSON")],
                [("Pierre Curie", "Marie Curie", "MARRY")],
            ),
            chunk("letters", 1, 0, [("marie curie", "PERSON")]),
        ]
    )
    found = graph_store.entity("MARIE CURIE")
    assert found["name"] == "Marie Curie" and found["type"] == "PERSON"
    assert found["mentions"] == [
        {"document_id": "letters", "filename": "letters.pdf", "page_number": 1},
        {"document_id": "report", "filename": "report.pdf", "page_number": 2},
        {"document_id": "report", "filename": "report.pdf", "page_number": 5},
    ]
    assert sorted((r["name"], r["rel_type"], r["direction"]) for r in found["related"]) == [
        ("Paris", "WORK_IN", "out"),
        ("Pierre Curie", "MARRY", "in"),
    ]
    assert graph_store.entity("Nobody At All") is None


# -- rewrites and deletes ----------------------------------------------------------------------------------------------
def test_rewriting_a_chunk_replaces_its_previous_extraction(graph_store):
    graph_store.write_chunks(
        [
            chunk("d", 1, 0, [("Alpha", "ORG"), ("Beta", "ORG")], [("Alpha", "Beta", "OWN")]),
            chunk("d", 1, 1, [("Alpha", "ORG"), ("Beta", "ORG")], [("Alpha", "Beta", "OWN")]),
        ]
    )
    graph_store.write_chunks([chunk("d", 1, 0, [("Alpha", "ORG"), ("Gamma", "ORG")], [("Alpha", "Gamma", "OWN")])])
    weights = relationship_weights(graph_store)
    assert weights == {("alpha", "beta", "OWN"): (1, ["d:1:1"]), ("alpha", "gamma", "OWN"): (1, ["d:1:0"])}
    graph_store.write_chunks([chunk("d", 1, 1, [("Delta", "ORG")])])
    assert graph_store.entity("Beta") is None  # no chunk mentions it any more
    assert relationship_weights(graph_store) == {("alpha", "gamma", "OWN"): (1, ["d:1:0"])}
    assert graph_store.counts() == {"documents": 1, "pages": 1, "chunks": 2, "entities": 3, "relationships": 1}


def test_delete_document_keeps_entities_other_documents_mention(graph_store):
    graph_store.write_chunks(
        [
            chunk(
                "a",
                1,
                0,
                [("Ada Lovelace", "PERSON"), ("Charles Babbage", "PERSON"), ("London", "GPE")],
                [("Ada Lovelace", "Charles Babbage", "CORRESPOND"), ("Ada Lovelace", "London", "LIVE_IN")],
            ),
            chunk(
                "b",
                1,
                0,
                [("Ada Lovelace", "PERSON"), ("Charles Babbage", "PERSON"), ("Analytical Engine", "PRODUCT")],
                [("Ada Lovelace", "Charles Babbage", "CORRESPOND"), ("Charles Babbage", "Analytical Engine", "DESIGN")],
            ),
        ]
    )
    assert relationship_weights(graph_store)[("ada lovelace", "charles babbage", "CORRESPOND")][0] == 2

    graph_store.delete_document("a")
    assert graph_store.entity("London") is None
    ada = graph_store.entity("Ada Lovelace")
    assert [m["document_id"] for m in ada["mentions"]] == ["b"]
    assert relationship_weights(graph_store) == {
        ("ada lovelace", "charles babbage", "CORRESPOND"): (1, ["b:1:0"]),
        ("charles babbage", "analytical engine", "DESIGN"): (1, ["b:1:0"]),
    }
    assert graph_store.counts() == {"documents": 1, "pages": 1, "chunks": 1, "entities": 3, "relationships": 2}
    assert graph_store.chunk_ids_with_writes("a") == set()
    assert graph_store.chunk_ids_with_writes() == {"b:1:0"}

    graph_store.delete_document("b")
    graph_store.delete_document("b")  # deleting what is gone is fine
    assert graph_store.counts() == {"documents": 0, "pages": 0, "chunks": 0, "entities": 0, "relationships": 0}


def test_delete_chunks_removes_emptied_pages_and_documents_only(graph_store):
    graph_store.write_chunks(
        [
            chunk("d", 1, 0, [("X Corp", "ORG")]),
            chunk("d", 2, 1, [("Y Corp", "ORG")]),
            chunk("e", 1, 0, [("X Corp", "ORG")]),
        ]
    )
    graph_store.delete_chunks(["d:1:0"])
    assert graph_store.counts() == {"documents": 2, "pages": 2, "chunks": 2, "entities": 2, "relationships": 0}
    graph_store.delete_chunks(["d:2:1", "not-a-chunk"])
    assert graph_store.counts() == {"documents": 1, "pages": 1, "chunks": 1, "entities": 1, "relationships": 0}
    assert graph_store.chunk_ids_with_writes() == {"e:1:0"}


# -- throughput (reported, not asserted beyond sanity) -----------------------------------------------------------------
def test_write_throughput(graph_store, record_property):
    people = [f"Person {i}" for i in range(300)]
    orgs = [f"Organisation {i}" for i in range(100)]
    chunks = []
    for i in range(200):
        ents = [(people[(i * 7 + k) % 300], "PERSON") for k in range(5)] + [
            (orgs[(i * 3 + k) % 100], "ORG") for k in range(3)
        ]
        rels = [(ents[k][0], ents[5 + k % 3][0], "WORK_FOR") for k in range(5)] + [
            (ents[k][0], ents[k + 1][0], "CO_OCCURS") for k in range(4)
        ]
        chunks.append(chunk(f"bench{i // 40}", 1 + (i % 40) // 4, i % 40, ents, rels))
    started = time.perf_counter()
    graph_store.write_chunks(chunks)
    first = time.perf_counter() - started
    started = time.perf_counter()
    graph_store.write_chunks(chunks)
    again = time.perf_counter() - started
    record_property("graph_write_chunks_per_s", round(len(chunks) / first, 1))
    record_property("graph_rewrite_chunks_per_s", round(len(chunks) / again, 1))
    print(
        f"\ngraph write: {len(chunks) / first:.0f} chunks/s (8 entities, 9 relations each), "
        f"rewrite: {len(chunks) / again:.0f} chunks/s"
    )
    counts = graph_store.counts()
    assert counts["chunks"] == 200 and counts["entities"] == 400 and counts["documents"] == 5


# -- the server itself -------------------------------------------------------------------------------------------------
def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = sock.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_bolt_server_listens_on_loopback_only(bolt_server):
    if os.environ.get("DOCQUEUE_TEST_NEO4J_URI"):
        pytest.skip("external server")
    port = int(bolt_server.uri.rsplit(":", 1)[1])
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    with pytest.raises(OSError):
        socket.create_connection((address, port), timeout=1).close()


_RACE_SCRIPT = """
import json, sys
from pathlib import Path
from resources.bolt_server import BoltServer
server = BoltServer(Path(sys.argv[1]), port=int(sys.argv[2]))
print(json.dumps({"uri": server.ensure_running(timeout_s=120), "started": server.last_start_seconds}))
"""


def _java_processes_for(home: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "com.arcadedb.server.ArcadeDBServer" in argv and f"-Darcadedb.server.rootPath={home}" in argv:
                pids.append(int(proc.name))
    return pids


def test_racing_starters_share_one_detached_server_that_keeps_data_across_restarts(tmp_path, monkeypatch):
    home, port = tmp_path / "bolt", free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE_SCRIPT, str(home), str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [json.loads(racer.communicate(timeout=180)[0]) for racer in racers]
    server = BoltServer(home, port=port)
    try:
        assert {r["uri"] for r in results} == {f"bolt://127.0.0.1:{port}"}
        assert sum(r["started"] is not None for r in results) == 1  # exactly one of them started it
        start_seconds = next(r["started"] for r in results if r["started"] is not None)
        print(f"\nBolt server start (cold, to first successful query): {start_seconds:.2f}s")
        # both starters have exited; the server they shared is still up, and it is the only one for this home
        assert server.is_running()
        assert _java_processes_for(home) == [json.loads((home / "server.json").read_text())["pid"]]
        assert stat.S_IMODE((home / "root_password").stat().st_mode) == 0o600
        assert server.password not in (home / "server.log").read_text()

        # the resource, with DOCQUEUE_NEO4J_URI unset, reuses the running embedded server
        monkeypatch.delenv("DOCQUEUE_NEO4J_URI", raising=False)
        monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path))
        monkeypatch.setenv("DOCQUEUE_BOLT_PORT", str(port))
        with Neo4jResource.from_settings(Settings.from_env()).get_store() as store:
            store.ensure_schema()
            store.write_chunks([chunk("kept", 1, 0, [("Durable Entity", "ORG")])])

        server.stop()
        assert not server.is_running() and _java_processes_for(home) == []
        assert server.ensure_running(timeout_s=120) == f"bolt://127.0.0.1:{port}"
        print(f"Bolt server restart (warm data): {server.last_start_seconds:.2f}s")
        with Neo4jResource.from_settings(Settings.from_env()).get_store() as store:
            assert store.entity("durable entity")["mentions"][0]["document_id"] == "kept"
    finally:
        server.stop()


def test_a_launched_server_is_waited_for_by_the_next_user_and_never_started_twice(tmp_path):
    """`docqueue run` launches the server before loading its code and waits for it afterwards: until the server has
    answered a query it is recorded as starting, and whoever opens it next waits for that, not only for its port."""
    home, port = tmp_path / "bolt", free_port()
    server = BoltServer(home, port=port)
    try:
        server.launch(timeout_s=120)
        state = json.loads((home / "server.json").read_text())
        assert state["ready"] is False
        assert _java_processes_for(home) == [state["pid"]]
        server.launch(timeout_s=120)  # starting already: nothing more is started
        assert _java_processes_for(home) == [state["pid"]]

        other = BoltServer(home, port=port)  # another process's view of the same home
        assert other.ensure_running(timeout_s=120) == f"bolt://127.0.0.1:{port}"
        assert other.last_start_seconds is None  # it waited for the launched server, started none
        assert json.loads((home / "server.json").read_text()) == {**state, "ready": True}
        with GraphStore(other.uri, other.user, other.password, other.database) as store:
            store.ensure_schema()  # ready means its database answers, not only its port
        server.launch(timeout_s=120)
        assert _java_processes_for(home) == [state["pid"]]
    finally:
        server.stop()


def test_a_server_is_known_to_its_home_as_soon_as_its_launch_returns(tmp_path):
    """The java launcher's command line can be empty for milliseconds after its process starts; a launch returns
    only once the process is recognisable, so the next starter sees it (and starts no second server on the same
    folder) and a stop right away stops it. Several launches, since that window is a race."""
    for attempt in range(4):
        home = tmp_path / f"bolt-{attempt}"
        server = BoltServer(home, port=free_port())
        try:
            server.launch(timeout_s=120)
            pid = json.loads((home / "server.json").read_text())["pid"]
            assert server._our_pid() == pid
        finally:
            server.stop()
        assert _java_processes_for(home) == []


def test_wrong_password_is_refused_without_echoing_it(bolt_server):
    import neo4j.exceptions

    secret = "not-the-password-" + "x" * 8
    with GraphStore(bolt_server.uri, bolt_server.user, secret, bolt_server.database) as store:
        with pytest.raises(neo4j.exceptions.Neo4jError) as raised:
            store.counts()
    assert secret not in str(raised.value)


def test_port_taken_by_something_else_is_reported(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(RuntimeError, match="already in use"):
            BoltServer(tmp_path / "bolt", port=port).ensure_running(timeout_s=10)


def test_resource_uses_the_configured_server_when_uri_is_set(graph_store, bolt_server, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_NEO4J_URI", bolt_server.uri)
    monkeypatch.setenv("DOCQUEUE_NEO4J_USER", bolt_server.user)
    monkeypatch.setenv("DOCQUEUE_NEO4J_PASSWORD", bolt_server.password)
    monkeypatch.setenv("DOCQUEUE_NEO4J_DATABASE", bolt_server.database or "")
    monkeypatch.setenv("DOCQUEUE_HOME", "/nonexistent-home-must-not-be-used")
    graph_store.write_chunks([chunk("d", 1, 0, [("Shared Entity", "ORG")])])
    with Neo4jResource.from_settings(Settings.from_env()).get_store() as store:
        assert store.entity("shared entity")["mentions"][0]["document_id"] == "d"
    # explicit fields win over the environment
    resource = Neo4jResource(
        uri=bolt_server.uri, user=bolt_server.user, password="wrong-password", database=bolt_server.database or ""
    )
    import neo4j.exceptions

    with resource.get_store() as store, pytest.raises(neo4j.exceptions.AuthError):
        store.counts()
