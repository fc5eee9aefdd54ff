"""Entity-name normalisation (the identity of an entity node), type rules, short-form resolution within a document
and the write-batch preparation, no services."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processing.entities import (
    ChunkGraph,
    Entity,
    EntityCollector,
    Extraction,
    ExtractionLimits,
    Relation,
    entity_type,
    is_short_form,
    normalize_entity_name,
    relation_type,
    resolve_aliases,
    type_rule_violation,
)
from processing.graph_content import DocumentAliases, chunk_content, last_write_wins
from resources.bolt_graph import _Batch


@pytest.mark.parametrize(
    "variant",
    [
        "Tim Cook",
        "tim cook",
        "TIM COOK",
        "  Tim   Cook ",
        "Tim\tCook\n",
        "Tim Cook.",
        '"Tim Cook"',
        "(Tim Cook)",
        "Ｔｉｍ Ｃｏｏｋ",  # full-width letters (NFKC)
        "Tim\u00a0Cook",  # no-break space
        "Tim \u200bCook",  # zero-width space next to a real space
        "Tim Cook\u00ad",  # soft hyphen
    ],
)
def test_variants_of_one_name_share_a_key(variant):
    assert normalize_entity_name(variant) == "tim cook"


@pytest.mark.parametrize(
    "left,right",
    [
        ("U.S.A.", "USA"),
        ("Smith-Jones", "Smith Jones"),
        ("Smith–Jones", "smith jones"),  # en dash
        ("AT&T", "at&t"),
        ("O'Brien", "OBrien"),
        ("O’Brien", "O'Brien"),  # typographic apostrophe
        ("ﬁnance ltd", "Finance Ltd"),  # ligature (NFKC)
        ("Straße", "STRASSE"),  # case folding, not lower()
        ("Café", "Cafe\u0301"),  # composed vs decomposed accent
    ],
)
def test_equivalent_spellings(left, right):
    assert normalize_entity_name(left) == normalize_entity_name(right)


@pytest.mark.parametrize(
    "left,right",
    [
        ("Apple", "Apples"),
        ("Paris", "Parish"),
        ("C++", "C"),
        ("Café", "Cafe"),  # accents are meaning, not formatting
    ],
)
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
    return ChunkGraph(
        document_id,
        f"{document_id}.pdf",
        page,
        chunk_id,
        0,
        Extraction([Entity(n, t) for n, t in entities], [Relation(*r) for r in relations]),
    )


def test_chunk_content_merges_variant_entities_and_drops_self_loops():
    content = chunk_content(
        _chunk(
            "c",
            [("Apple", "ORG"), ("APPLE", "ORG"), ("Tim Cook", "PERSON")],
            [("tim cook", "apple", "LEAD"), ("apple", "apple", "BE")],
        )
    )
    assert sorted(content.entities) == ["apple", "tim cook"]
    assert content.entities["apple"].name == "Apple"  # first spelling wins
    assert content.relations == {("tim cook", "apple", "LEAD")}


def test_hand_made_keys_are_normalised_before_writing():
    chunk = _chunk("c", [], [])
    chunk.extraction = Extraction(
        [Entity("Apple", "ORG", key="Apple Inc."), Entity("apple inc", "ORG")],
        [Relation("APPLE INC", "apple inc.", "SELF")],
    )
    content = chunk_content(chunk)
    assert list(content.entities) == ["apple inc"]
    assert content.relations == set()  # a self-loop once both ends are one entity


def test_relation_to_an_entity_the_chunk_does_not_have_is_rejected():
    with pytest.raises(ValueError, match="not one of its entities"):
        chunk_content(_chunk("c", [("Apple", "ORG")], [("apple", "google", "BUY")]))


def test_batch_aggregates_relation_chunk_ids_and_dedupes_nodes():
    batch = _Batch.of(
        [
            _chunk("c1", [("Apple", "ORG"), ("Tim Cook", "PERSON")], [("tim cook", "apple", "LEAD")]),
            _chunk("c2", [("apple", "ORG"), ("Tim  Cook", "PERSON")], [("tim cook", "apple", "LEAD")], page=2),
        ]
    )
    assert [d["id"] for d in batch.documents] == ["doc"]
    assert [p["id"] for p in batch.pages] == ["doc#p1", "doc#p2"]
    assert [e["key"] for e in batch.entities] == ["apple", "tim cook"]
    assert batch.relations == [{"source": "tim cook", "target": "apple", "type": "LEAD", "chunk_ids": ["c1", "c2"]}]
    assert len(batch.mentions) == 4


def test_last_write_of_a_chunk_id_wins():
    first = _chunk("c1", [("Apple", "ORG")], [])
    second = _chunk("c1", [("Google", "ORG")], [])
    assert last_write_wins([first, second]) == [second]


# -- type rules ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,type_",
    [
        ("205–7 Clark", "PERSON"),  # page range glued to a cited name
        ("205-7 Clark", "PERSON"),
        ("12 Lessig", "PERSON"),  # footnote number
        ("3 — 4 Smith", "ORG"),  # a locator opens no name of any type
        ("Lessig12", "PERSON"),  # digits inside a person name
        ("John Smith 1999", "PERSON"),
        ("J. R.", "PERSON"),  # initials alone
        ("lessig@example.org", "PERSON"),
        ("www.lessig.org", "PERSON"),
        ("Zaleski et al.", "PERSON"),  # a paper cited by its first author
        ("Lawrence Lessig Free Culture How Big Media Uses", "PERSON"),
    ],
)
def test_type_rules_turn_down(name, type_):
    assert type_rule_violation(name, type_)


@pytest.mark.parametrize(
    "name,type_",
    [
        ("Lawrence Lessig", "PERSON"),
        ("Lessig", "PERSON"),
        ("J. R. R. Tolkien", "PERSON"),
        ("O'Brien", "PERSON"),
        ("Jean-Luc Picard", "PERSON"),
        ("3M", "ORG"),
        ("7-Eleven", "ORG"),
        ("20th Century Fox", "ORG"),  # digits belong to these names
        ("Route 66", "LOC"),
        ("Windows 95", "PRODUCT"),
        ("1984", "WORK_OF_ART"),
    ],
)
def test_type_rules_accept(name, type_):
    assert type_rule_violation(name, type_) is None


def test_collector_drops_and_counts_names_its_type_rules_turn_down():
    collector = EntityCollector(ExtractionLimits())
    assert collector.add_entity("205–7 Clark", "PERSON") is None
    assert collector.add_entity("205–7  Clark", "PERSON") is None  # the same name again counts once
    assert collector.add_entity("Clark", "PERSON") == "clark"
    extraction = collector.result()
    assert [e.key for e in extraction.entities] == ["clark"] and extraction.rejected == {"PERSON": 1}


# -- short forms within a document -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "short,full,type_,expected",
    [
        ("lessig", "lawrence lessig", "PERSON", True),
        ("lawrence", "lawrence lessig", "PERSON", False),  # a first name is shared by too many people
        ("microsoft", "microsoft corporation", "ORG", True),
        ("microsoft", "microsoft research", "ORG", False),  # only a legal form is dropped
        ("corporation", "microsoft corporation", "ORG", False),
        ("free culture", "free culture how big media uses technology", "WORK_OF_ART", True),
        ("copyright act", "copyright act of 1976", "LAW", True),
        ("york", "new york", "GPE", False),  # places, products, events are not shortened
        ("windows", "windows 95", "PRODUCT", False),
        ("world war", "world war ii", "EVENT", False),
        ("al", "zaleski et al", "PERSON", False),  # too short to stand for one name
        ("brown", "d 95 brown", "PERSON", False),  # a bare number makes the longer name debris
        ("lawrence lessig", "lawrence lessig", "PERSON", False),
        ("essig", "lawrence lessig", "PERSON", False),  # whole words only
    ],
)
def test_short_forms(short, full, type_, expected):
    assert is_short_form(short, full, type_) is expected


DOCUMENT = [
    ("lessig", "PERSON"),
    ("lawrence lessig", "PERSON"),
    ("smith", "PERSON"),
    ("adam smith", "PERSON"),
    ("john smith", "PERSON"),
    ("microsoft", "ORG"),
    ("microsoft corporation", "ORG"),
    ("lessig", "ORG"),
    ("york", "GPE"),
    ("new york", "GPE"),
    ("valenti", "PERSON"),
    ("jack valenti", "PERSON"),
    ("professor jack valenti", "PERSON"),
]


def test_resolution_takes_the_one_longest_name_and_leaves_ambiguous_ones():
    assert resolve_aliases(DOCUMENT) == {
        "lessig": "lawrence lessig",
        "microsoft": "microsoft corporation",
        "valenti": "professor jack valenti",
        "jack valenti": "professor jack valenti",
    }


@given(st.permutations(DOCUMENT))
def test_resolution_does_not_depend_on_the_order_names_arrive_in(order):
    assert resolve_aliases(order) == resolve_aliases(DOCUMENT)


def test_recorded_aliases_stand_when_the_names_no_longer_decide():
    # "smith" was resolved before "john smith" arrived: a re-run keeps it, it does not split the node again
    recorded = {"smith": "adam smith"}
    assert resolve_aliases(DOCUMENT, recorded)["smith"] == "adam smith"
    # a recorded alias follows its full name when that resolves further
    assert (
        resolve_aliases(
            [("jack valenti", "PERSON"), ("professor jack valenti", "PERSON")], {"valenti": "jack valenti"}
        )["valenti"]
        == "professor jack valenti"
    )
    # links that go round in a circle resolve nothing
    assert resolve_aliases([], {"a": "b", "b": "a"}) == {}


def test_chunk_content_writes_a_short_form_as_its_full_name_with_the_alias():
    aliases = DocumentAliases({"lessig": "lawrence lessig"}, {"lawrence lessig": Entity("Lawrence Lessig", "PERSON")})
    content = chunk_content(
        _chunk("c", [("Lessig", "PERSON"), ("Jack Valenti", "PERSON")], [("lessig", "jack valenti", "MEET")]), aliases
    )
    assert content.entities["lawrence lessig"].name == "Lawrence Lessig"
    assert content.aliases == {"lawrence lessig": ["lessig"]}
    assert content.relations == {("lawrence lessig", "jack valenti", "MEET")}
    both = chunk_content(
        _chunk(
            "c", [("Lessig", "PERSON"), ("LAWRENCE LESSIG", "PERSON")], [("lessig", "lawrence lessig", "CO_OCCURS")]
        ),
        aliases,
    )
    assert list(both.entities) == ["lawrence lessig"] and both.entities["lawrence lessig"].name == "LAWRENCE LESSIG"
    assert both.relations == set()


def test_types_are_upper_snake_and_bounded():
    assert relation_type("works for") == "WORKS_FOR"
    assert relation_type("--") == ""
    assert entity_type("--") == "OTHER"
    assert entity_type("work of art") == "WORK_OF_ART"
    assert len(relation_type("x" * 80)) == 50
