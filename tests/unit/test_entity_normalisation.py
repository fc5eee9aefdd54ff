"""Entity-name normalisation (the identity of an entity node) and the write-batch preparation, no services."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resources.neo4j import (
    ChunkGraph,
    Entity,
    Extraction,
    Relation,
    _Batch,
    _chunk_content,
    _last_write_wins,
    normalize_entity_name,
)


@pytest.mark.parametrize("variant", [
    "Tim Cook", "tim cook", "TIM COOK", "  Tim   Cook ", "Tim\tCook\n", "Tim Cook.", "\"Tim Cook\"", "(Tim Cook)",
    "Ｔｉｍ Ｃｏｏｋ",          # full-width letters (NFKC)
    "Tim\u00a0Cook",          # no-break space
    "Tim \u200bCook",        # zero-width space next to a real space
    "Tim Cook\u00ad",         # soft hyphen
])
def test_variants_of_one_name_share_a_key(variant):
    assert normalize_entity_name(variant) == "tim cook"


@pytest.mark.parametrize("left,right", [
    ("U.S.A.", "USA"),
    ("Smith-Jones", "Smith Jones"),
    ("Smith–Jones", "smith jones"),     # en dash
    ("AT&T", "at&t"),
    ("O'Brien", "OBrien"),
    ("O’Brien", "O'Brien"),             # typographic apostrophe
    ("ﬁnance ltd", "Finance Ltd"),       # ligature (NFKC)
    ("Straße", "STRASSE"),              # case folding, not lower()
    ("Café", "Cafe\u0301"),             # composed vs decomposed accent
])
def test_equivalent_spellings(left, right):
    assert normalize_entity_name(left) == normalize_entity_name(right)


@pytest.mark.parametrize("left,right", [
    ("Apple", "Apples"),
    ("Paris", "Parish"),
    ("C++", "C"),
    ("Café", "Cafe"),   # accents are meaning, not formatting
])
def test_different_names_stay_different(left, right):
    assert normalize_entity_name(left) != normalize_entity_name(right)


def test_punctuation_only_names_normalise_to_empty():
    assert normalize_entity_name(" ... ,; ") == ""


@given(st.text(max_size=60))
def test_normalisation_is_idempotent_and_collapsed(text):
    key = normalize_entity_name(text)
    assert normalize_entity_name(key) == key
    assert key == key.strip()
    assert "  " not in key and "\n" not in key and "\t" not in key


def test_entity_key_defaults_to_normalised_name():
    assert Entity("  Apple Inc. ", "ORG").key == "apple inc"
    assert Entity("Apple", "ORG", key="custom").key == "custom"


def _chunk(chunk_id, entities, relations, document_id="doc", page=1):
    return ChunkGraph(document_id, f"{document_id}.pdf", page, chunk_id, 0,
                      Extraction([Entity(n, t) for n, t in entities], [Relation(*r) for r in relations]))


def test_chunk_content_merges_variant_entities_and_drops_self_loops():
    content = _chunk_content(_chunk("c", [("Apple", "ORG"), ("APPLE", "ORG"), ("Tim Cook", "PERSON")],
                                    [("tim cook", "apple", "LEAD"), ("apple", "apple", "BE")]))
    assert sorted(content.entities) == ["apple", "tim cook"]
    assert content.entities["apple"].name == "Apple"  # first spelling wins
    assert content.relations == {("tim cook", "apple", "LEAD")}


def test_hand_made_keys_are_normalised_before_writing():
    chunk = _chunk("c", [], [])
    chunk.extraction = Extraction([Entity("Apple", "ORG", key="Apple Inc."), Entity("apple inc", "ORG")],
                                  [Relation("APPLE INC", "apple inc.", "SELF")])
    content = _chunk_content(chunk)
    assert list(content.entities) == ["apple inc"]
    assert content.relations == set()  # a self-loop once both ends are one entity


def test_relation_to_an_entity_the_chunk_does_not_have_is_rejected():
    with pytest.raises(ValueError, match="not one of its entities"):
        _chunk_content(_chunk("c", [("Apple", "ORG")], [("apple", "google", "BUY")]))


def test_batch_aggregates_relation_chunk_ids_and_dedupes_nodes():
    batch = _Batch.of([
        _chunk("c1", [("Apple", "ORG"), ("Tim Cook", "PERSON")], [("tim cook", "apple", "LEAD")]),
        _chunk("c2", [("apple", "ORG"), ("Tim  Cook", "PERSON")], [("tim cook", "apple", "LEAD")], page=2),
    ])
    assert [d["id"] for d in batch.documents] == ["doc"]
    assert [p["id"] for p in batch.pages] == ["doc#p1", "doc#p2"]
    assert [e["key"] for e in batch.entities] == ["apple", "tim cook"]
    assert batch.relations == [{"source": "tim cook", "target": "apple", "type": "LEAD", "chunk_ids": ["c1", "c2"]}]
    assert len(batch.mentions) == 4


def test_last_write_of_a_chunk_id_wins():
    first = _chunk("c1", [("Apple", "ORG")], [])
    second = _chunk("c1", [("Google", "ORG")], [])
    assert _last_write_wins([first, second]) == [second]
