"""Entities beside search hits, on real parts: documents run through every phase (OCR, vectors, spaCy into the
embedded Bolt server), then searched through the warm session and `docqueue search`. Each hit carries the entities
its chunk mentions, `--graph` adds the entities related to those with relation and weight, the bounds hold, another
tenant sees only its own graph, and a graph that does not answer leaves the hits with one sentence."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from queue_db.config import QueueSettings, Settings
from queue_db.phases import ALL_KINDS
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
from resources.search_session import SearchSession
from tests.integration.bolt_fixture import free_port

LOVELACE = (
    "Ada Lovelace wrote the first published program for the Analytical Engine of Charles Babbage. "
    "Ada Lovelace and Charles Babbage met in London."
)
FARADAY = (
    "Charles Babbage corresponded with Michael Faraday about the Royal Institution. "
    "Michael Faraday lectured at the Royal Institution in London."
)
QUERY = "the first published program for the Analytical Engine"


def docqueue(*args: str) -> Result:
    """The command in this process (the model stays loaded between searches); its settings come from the
    environment as in a shell."""
    from orchestration.cli import main

    return CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args), catch_exceptions=False)


def ok(*args: str) -> str:
    done = docqueue(*args)
    assert done.exit_code == 0, done.output
    return done.stdout


def write(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    for name, text in texts.items():
        (folder / f"{name}.md").write_text(f"# {name.title()}\n\n{text}\n")
    return folder


def process_every_phase(queue_url: str) -> None:
    """OCR, vectors and GraphRAG of every ready task, in the pipeline the workers run (no Dagster run needed)."""
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline

    queue = TaskQueue(create_queue_engine(queue_url), QueueSettings())
    pipeline = Pipeline.from_settings(queue, Settings.from_env())
    worker = make_worker_id()
    try:
        while any(queue.ready_counts().values()):
            for kind in ALL_KINDS:
                claimed = queue.claim(kind, worker, 50)
                if claimed:
                    outcomes = process_tasks(pipeline, kind, worker, claimed)
                    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    finally:
        pipeline.close()
        queue.engine.dispose()


def test_hits_carry_their_entities_and_the_graph_around_them(docqueue_env, tmp_path, monkeypatch):
    ok("ingest", str(write(tmp_path / "shared", {"lovelace": LOVELACE, "faraday": FARADAY})))
    ok("ingest", str(write(tmp_path / "acme", {"lovelace": LOVELACE})), "--tenant", "acme")
    process_every_phase(docqueue_env.queue_url)

    with SearchSession(Settings.from_env()) as session:
        found = session.search(QUERY, 1)
        hit = found.hits[0]
        assert hit.document == "lovelace.md" and found.graph_notice is None
        assert {(e.name, e.type) for e in hit.entities} >= {("Ada Lovelace", "PERSON"), ("Charles Babbage", "PERSON")}
        assert hit.entities_total == len(hit.entities) and hit.related == []
        # the entities the chunk does not mention, through relations its entities have elsewhere
        related = session.search(QUERY, 1, graph=True).hits[0].related
        assert related and all(r.name not in {e.name for e in hit.entities} for r in related)
        faraday = [r for r in related if r.name == "Michael Faraday" and r.entity == "Charles Babbage"]
        assert faraday and all(r.weight >= 1 and r.direction == "out" and r.relation for r in faraday), related
        assert [r.weight for r in related] == sorted((r.weight for r in related), reverse=True)
        assert session.search(QUERY, 1, entities=False).hits[0].entities == []
        # the same document in another tenant: its own entity nodes, and none of the default tenant's relations
        acme = session.search(QUERY, 1, tenant="acme", graph=True).hits[0]
        assert {e.name for e in acme.entities} == {e.name for e in hit.entities}
        assert "Michael Faraday" not in {r.name for r in acme.related}

    monkeypatch.setenv("DOCQUEUE_SEARCH_ENTITIES_PER_HIT", "2")
    monkeypatch.setenv("DOCQUEUE_SEARCH_RELATED_PER_HIT", "1")
    printed = json.loads(ok("search", QUERY, "--limit", "2", "--graph", "--json"))
    assert printed["graph_notice"] is None
    for shown in printed["hits"]:
        assert len(shown["entities"]) == 2 and shown["entities_total"] >= 3 and len(shown["related"]) <= 1
    assert printed["hits"][0]["related"][0].keys() == {"entity", "name", "type", "relation", "weight", "direction"}
    strongest = printed["hits"][0]["related"][0]
    table = ok("search", QUERY, "--limit", "1", "--graph")
    assert "Ada Lovelace (PERSON)" in table and f"+{printed['hits'][0]['entities_total'] - 2} more" in table
    assert f"-{strongest['relation']} {strongest['weight']}-" in table and strongest["name"] in table

    monkeypatch.setenv("DOCQUEUE_NEO4J_URI", f"bolt://127.0.0.1:{free_port()}")  # nothing listens there
    down = docqueue("search", QUERY, "--limit", "1")
    assert down.exit_code == 0, down.output
    assert "lovelace.md" in down.stdout and "Traceback" not in down.stderr
    assert down.stderr.strip().startswith("Entities are not shown:") and len(down.stderr.strip().splitlines()) == 1
