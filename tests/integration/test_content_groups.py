"""Content groups of near-duplicate documents on a real PostgreSQL and a real file store: documents whose pages
differ by a word per page form a group, placing is idempotent, a group stays consistent when members are deleted
and re-registered, documents sharing one page stay apart, signatures of an older format are compared with none until
`docqueue regroup` signs them again, and finding candidates reads the band table's index, not the corpus."""

from __future__ import annotations

import json
import random

import pytest

from orchestration.content_groups import DEFAULTS, place_documents, sign_again
from orchestration.intake import ingest_paths
from processing.near_duplicates import FORMAT, signature
from queue_db.config import Settings
from queue_db.lifecycle import delete_rows
from queue_db.near_duplicates import copies_of, group_counts
from queue_db.readmodels import document_progress_rows
from resources.storage import LocalStorage, page_file_key, storage_root
from tests.cli_runner import docqueue
from tests.queue_support import expand, ocr_all, register

VOCABULARY = [f"{a}{b}" for a in ("bar", "cor", "del", "fen", "gal", "hut", "lim", "mor") for b in range(60)]


def pages_of(seed: int, pages: int = 3, words: int = 120) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCABULARY) for _ in range(words)) for _ in range(pages)]


def one_word_changed(pages: list[str], at: int = 60) -> list[str]:
    changed = []
    for page in pages:
        words = page.split()
        words[at] = "changed"
        changed.append(" ".join(words))
    return changed


@pytest.fixture
def storage(tmp_path):
    return LocalStorage(tmp_path / "storage")


def ocr_done(queue, storage, name: str, pages: list[str]) -> dict:
    """A document whose OCR completed with these page texts in the file store."""
    doc = register(queue, name)
    expand(queue, doc, len(pages))
    ocr_all(queue, doc)
    for number, text in enumerate(pages, start=1):
        storage.put_text(page_file_key(doc["document_key"], number), text)
    return {"id": str(doc["id"]), "document_key": doc["document_key"], "pages": len(pages)}


def place(queue, storage, *documents):
    return place_documents(queue, storage, documents, DEFAULTS)


def rows(queue, table: str) -> int:
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()


def test_near_duplicates_form_a_group_once_and_others_stay_alone(queue, storage):
    text = pages_of(1)
    first = ocr_done(queue, storage, "manual.pdf", text)
    copy = ocr_done(queue, storage, "manual-rescan.pdf", one_word_changed(text))
    other = ocr_done(queue, storage, "other.pdf", pages_of(2))
    placed = place(queue, storage, first, copy, other)
    assert placed[first["document_key"]].group_id is None  # alone when it was placed
    assert placed[other["document_key"]].group_id is None
    joined = placed[copy["document_key"]]
    assert joined.group_id and joined.copies == 1 and 0.8 <= joined.similarity < 1
    assert joined.representative_key == first["document_key"]  # the earliest registered member

    bands, members = rows(queue, "document_signature_bands"), rows(queue, "content_group_members")
    again = place(queue, storage, copy, first, other)  # at-least-once: the roll-up runs again
    assert again[copy["document_key"]] == joined and again[first["document_key"]].group_id == joined.group_id
    assert (rows(queue, "document_signature_bands"), rows(queue, "content_group_members")) == (bands, members)
    assert rows(queue, "content_groups") == 1

    found = copies_of(queue.engine, [first["id"], other["id"]])
    assert list(found) == [first["id"]] and found[first["id"]]["keys"] == [copy["document_key"]]
    # a hit whose payload names no queue document (another program's point in a shared collection) is in no group
    assert copies_of(queue.engine, ["not-a-document", first["id"], "None"]) == found
    assert copies_of(queue.engine, ["not-a-document"]) == {}
    assert group_counts(queue.engine) == {"groups": 1, "grouped_documents": 2, "copies": 1}
    assert group_counts(queue.engine, tenant="someone-else")["groups"] == 0


def test_a_group_survives_deletes_and_re_ingest(queue, storage):
    text = pages_of(3)
    first, second, third = (
        ocr_done(queue, storage, f"notice-{n}.pdf", one_word_changed(text, at=10 * n)) for n in range(3)
    )
    placed = place(queue, storage, first, second, third)
    group = placed[third["document_key"]].group_id
    assert placed[second["document_key"]].group_id == group and placed[third["document_key"]].copies == 2

    # the representative goes (as `docqueue delete` removes its rows): the earliest remaining member takes its place
    assert delete_rows(queue, first["id"])
    assert copies_of(queue.engine, [second["id"]])[second["id"]]["representative"] == second["document_key"]
    # a group of one left is no group
    assert delete_rows(queue, second["id"])
    assert copies_of(queue.engine, [third["id"]]) == {}
    assert rows(queue, "content_groups") == 0 and rows(queue, "content_group_members") == 0
    assert rows(queue, "document_signatures") == 1

    # the same file ingested again joins the one left
    back = ocr_done(queue, storage, "notice-0.pdf", one_word_changed(text, at=0))
    placed = place(queue, storage, back)
    assert placed[back["document_key"]].copies == 1
    assert placed[back["document_key"]].representative_key == third["document_key"]
    [status] = document_progress_rows(queue.engine, third["id"])
    assert status["content_group"] == {
        "representative": third["document_key"],
        "similarity": placed[back["document_key"]].similarity,
        "copies": 1,
        "keys": [back["document_key"]],
    }


def test_a_new_version_keeps_its_version_link_and_joins_the_group(queue, storage, tmp_path):
    path = tmp_path / "inbox" / "policy.md"
    path.parent.mkdir()
    text = pages_of(5, pages=1, words=200)
    documents = []
    for content in (text, one_word_changed(text)):
        path.write_text(content[0])
        [registered] = ingest_paths(queue, storage, [path])
        doc = queue.document(registered.document_id)
        expand(queue, doc, 1)
        ocr_all(queue, doc)
        storage.put_text(page_file_key(doc["document_key"], 1), content[0])
        documents.append({"id": str(doc["id"]), "document_key": doc["document_key"], "pages": 1})
    old, new = documents
    placed = place(queue, storage, old, new)
    assert placed[new["document_key"]].representative_key == old["document_key"]
    assert str(queue.document(new["id"])["supersedes"]) == old["id"]


def test_a_changed_text_replaces_the_signature_and_its_bands(queue, storage):
    doc = ocr_done(queue, storage, "draft.pdf", pages_of(6))
    place(queue, storage, doc)
    storage.put_text(page_file_key(doc["document_key"], 1), pages_of(8, pages=1)[0])  # its OCR was redone
    place(queue, storage, doc)
    with queue.engine.connect() as conn:
        bands = conn.exec_driver_sql(
            "SELECT band, hash FROM document_signature_bands WHERE document_id = %s ORDER BY band", (doc["id"],)
        ).all()
    texts = [storage.get_text(page_file_key(doc["document_key"], n)) for n in (1, 2, 3)]
    assert [tuple(b) for b in bands] == signature(texts).bands()  # type: ignore[union-attr]


def test_finding_candidates_reads_the_band_index(queue, storage):
    from queue_db.near_duplicates import _CANDIDATES

    doc = ocr_done(queue, storage, "alone.pdf", pages_of(4))
    place(queue, storage, doc)
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql(
                "EXPLAIN " + _CANDIDATES,
                {
                    "bands": [0, 1],
                    "hashes": [1, 2],
                    "d": doc["id"],
                    "max": 100,
                    "minhash": [1] * 120,
                    "tenant": "default",
                    "format": FORMAT,
                },
            )
        )
    assert "document_signature_bands_pkey" in plan and "Seq Scan on document_signature_bands" not in plan, plan


def test_a_text_layer_page_with_markup_groups_with_its_plain_copies(queue, storage):
    # the page markdown of a highlighted text layer wraps every line in <mark>; its re-scan's OCR text does not
    text = pages_of(5)
    marked = ["\n".join(f"<mark>{line}</mark>" for line in _lines(page)) for page in text]
    original = ocr_done(queue, storage, "highlighted.pdf", marked)
    rescan = ocr_done(queue, storage, "highlighted-rescan.pdf", one_word_changed(text))
    other = ocr_done(queue, storage, "other.pdf", pages_of(6))
    placed = place(queue, storage, original, rescan, other)
    joined = placed[rescan["document_key"]]
    assert joined.group_id is not None and joined.representative_key == original["document_key"]
    assert joined.similarity >= 0.8
    assert placed[other["document_key"]].group_id is None


def _lines(page: str, width: int = 12) -> list[str]:
    words = page.split()
    return [" ".join(words[i : i + width]) for i in range(0, len(words), width)]


def test_documents_sharing_a_notice_page_form_no_group(queue, storage):
    # the same cover notice on every document, a page of their own after it: about half of their text is shared
    notice = pages_of(20, pages=1)[0]
    documents = [ocr_done(queue, storage, f"letter-{n}.pdf", [notice, pages_of(30 + n, pages=1)[0]]) for n in range(4)]
    placed = place(queue, storage, *documents)
    assert all(p.group_id is None for p in placed.values()), placed
    assert rows(queue, "content_groups") == 0


def _signed_by_an_older_docqueue(queue, doc: dict) -> None:
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE document_signatures SET format = 1 WHERE document_id = %s", (doc["id"],))


def test_a_signature_of_an_older_format_is_compared_with_none_until_signed_again(queue, storage):
    text = pages_of(40)
    old = ocr_done(queue, storage, "signed-before.pdf", text)
    place(queue, storage, old)
    _signed_by_an_older_docqueue(queue, old)
    blank = ocr_done(queue, storage, "blank-now.pdf", pages_of(41))
    place(queue, storage, blank)
    _signed_by_an_older_docqueue(queue, blank)
    for number in (1, 2, 3):  # its pages hold no word any more: it has no signature to give
        storage.put_text(page_file_key(blank["document_key"], number), "—")
    # its bands are the same, but a signature of another format estimates nothing about this one
    copy = ocr_done(queue, storage, "copy.pdf", one_word_changed(text))
    assert place(queue, storage, copy)[copy["document_key"]].group_id is None
    assert sign_again(queue, storage, DEFAULTS, batch=1) == {"signed": 1, "joined": 1}
    assert copies_of(queue.engine, [old["id"]])[old["id"]]["keys"] == [copy["document_key"]]
    with queue.engine.connect() as conn:
        formats = dict(conn.exec_driver_sql("SELECT document_id::text, format FROM document_signatures").all())
    assert formats == {old["id"]: FORMAT, copy["id"]: FORMAT}
    assert sign_again(queue, storage, DEFAULTS) == {"signed": 0, "joined": 0}


def test_docqueue_regroup_signs_old_documents_again(queue, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCQUEUE_DATABASE_URL", queue.engine.url.render_as_string(hide_password=False))
    storage = LocalStorage(storage_root(Settings.from_env()))  # where the command's storage reads
    text = pages_of(50)
    old = ocr_done(queue, storage, "scanned-2019.pdf", text)
    place(queue, storage, old)
    _signed_by_an_older_docqueue(queue, old)
    copy = ocr_done(queue, storage, "scanned-2024.pdf", one_word_changed(text))
    place(queue, storage, copy)
    done = docqueue("regroup", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"signed": 1, "joined": 1}
    assert copies_of(queue.engine, [copy["id"]])[copy["id"]]["keys"] == [old["document_key"]]
    again = docqueue("regroup")
    assert again.returncode == 0 and again.stdout.startswith("0 document(s) signed again"), again.stdout
