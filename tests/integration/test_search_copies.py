"""Search collapses copies: near-duplicate documents of one content group give one hit that names the others, in
the warm session and in `docqueue search --json`; `--all` shows every copy. Real PostgreSQL, the real model, the
embedded vector store; the groups are placed as the OCR roll-up places them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from orchestration.cli import main
from orchestration.content_groups import DEFAULTS, place_documents
from queue_db.config import Settings
from resources.embeddings import get_embedder
from resources.ports import ChunkPoint
from resources.search_session import SearchSession
from resources.storage import LocalStorage, page_file_key
from resources.vector_payload import chunk_payload
from resources.vector_stores import open_vector_store, vector_store_settings
from tests.integration.test_content_groups import ocr_done

MANUAL = [
    "To replace the pump filter, close the inlet valve, unscrew the housing and rinse the mesh in warm water. "
    "Check the rubber seal for cracks before the housing goes back on, and replace it when it has hardened. "
    "Tighten the housing by hand only: a wrench cracks the plastic thread. Open the inlet valve slowly and "
    "watch the housing for drops during the first minute of running.",
    "The pressure gauge should read between two and three bar once the system has been refilled and bled. "
    "A reading below one bar means air is still trapped in the radiators or a joint is leaking somewhere. "
    "Bleed each radiator from the lowest floor upwards, then top the system up through the filling loop and "
    "close the loop firmly afterwards so the pressure does not creep up overnight.",
]
RESCAN = [page.replace("warm water", "clean water").replace("refilled and", "refilled then") for page in MANUAL]
OTHER = [
    "Replace the kitchen tap washer by turning off the water supply and removing the handle with a hex key.",
    "Pressure in the garden hose drops when the outdoor filter clogs with sand from the well.",
]


@pytest.fixture
def indexed(queue, database_url, tmp_path, monkeypatch):
    """Three documents on the search path: a manual, its re-scan with a word changed per page, another text."""
    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCQUEUE_DATABASE_URL", database_url)
    monkeypatch.setenv("DOCQUEUE_QDRANT_PATH", str(tmp_path / "home" / "qdrant"))
    monkeypatch.setenv("DOCQUEUE_QDRANT_URL", "")
    storage = LocalStorage(tmp_path / "storage")
    documents = [
        ocr_done(queue, storage, name, pages)
        for name, pages in (("manual.pdf", MANUAL), ("manual-rescan.pdf", RESCAN), ("tap.pdf", OTHER))
    ]
    placed = place_documents(queue, storage, documents, DEFAULTS)
    assert placed[documents[1]["document_key"]].group_id is not None
    embedder = get_embedder()
    store = open_vector_store(vector_store_settings(Settings.from_env()), embedder.model_id, embedder.dim)
    try:
        store.ensure_collection()
        points = []
        for document in documents:
            for page in range(1, document["pages"] + 1):
                text = storage.get_text(page_file_key(document["document_key"], page))
                points.append(
                    ChunkPoint(
                        f"{document['document_key']}-{page}",
                        embedder.embed_one(text),
                        chunk_payload(
                            document_id=document["id"],
                            document_key=document["document_key"],
                            tenant_id="default",
                            filename=document["document_key"],
                            page_number=page,
                            chunk_index=0,
                            text=text,
                            content_hash=document["document_key"],
                            tokens=30,
                            embedded_tokens=30,
                        ),
                    )
                )
        store.upsert(points)
    finally:
        store.close()
    return [d["document_key"] for d in documents]


def test_copies_collapse_into_one_hit_that_names_them(indexed):
    manual, rescan, tap = indexed
    query = "rinse the pump filter mesh"
    with SearchSession(Settings.from_env()) as session:
        collapsed = session.search(query, 3)
        every = session.search(query, 3, all_copies=True)
        printed = CliRunner().invoke(main, ["search", query, "--limit", "3", "--json"])
        printed_all = CliRunner().invoke(main, ["search", query, "--limit", "3", "--json", "--all"])
        table = CliRunner().invoke(main, ["search", query, "--limit", "3"], env={"COLUMNS": "250"})
    # one hit per group: the manual's best page, naming the re-scan; the other hits are the other document's
    first = collapsed.hits[0]
    assert first.document_key in (manual, rescan) and first.also_in == 1
    assert first.also_in_keys == [rescan if first.document_key == manual else manual]
    assert len(collapsed.hits) == 3  # over-fetched: collapsing still gives the hits asked for
    assert [h.document_key for h in collapsed.hits[1:]].count(tap) == 2
    # --all: both copies are there, each still naming the other
    assert {h.document_key for h in every.hits[:2]} == {manual, rescan}
    assert all(h.also_in == 1 for h in every.hits if h.document_key != tap)
    assert printed.exit_code == 0 and json.loads(printed.output) == collapsed.as_dict()
    assert printed_all.exit_code == 0 and json.loads(printed_all.output) == every.as_dict()
    assert "also in 1 document" in table.output


def test_status_and_stats_show_the_group(indexed):
    manual, rescan, tap = indexed
    status = CliRunner().invoke(main, ["status", rescan, "--json"])
    assert status.exit_code == 0, status.output
    [record] = json.loads(status.output)["documents"]
    assert record["content_group"]["representative"] == manual and record["content_group"]["keys"] == [manual]
    listing = CliRunner().invoke(main, ["status"], env={"COLUMNS": "400"})
    assert f"near duplicates (1): {rescan}; group of {manual}" in listing.output
    stats = CliRunner().invoke(main, ["stats", "--json"])
    assert json.loads(stats.output)["content_groups"] == {"groups": 1, "grouped_documents": 2, "copies": 1}
    assert "content groups: 1, holding 1 near-duplicate copy" in CliRunner().invoke(main, ["stats"]).output
