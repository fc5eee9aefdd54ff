"""Collapsing copies in search (resources/search_copies.py), on stand-in hits and groups: one hit per content group,
best first; a deeper look when copies leave too few; every hit with `all_copies`."""

from __future__ import annotations

import pytest

from resources import search_copies
from resources.ports import MAX_SEARCH_LIMIT, SearchHit

# documents a1..a3 are one content group, b1 and b2 another; c and d stand alone
GROUPS = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B"}
RANKING = ["a1", "a2", "a3", "b1", "a1", "b2", "c", "a2", "d"]


def hits(n: int) -> list[SearchHit]:
    return [SearchHit(1.0 - i / 100, f"chunk{i}", {"document_id": doc}) for i, doc in enumerate(RANKING[:n])]


@pytest.fixture
def groups(monkeypatch):
    """copies_of as the queue answers it: each grouped document's group and its other members."""

    def copies_of(engine, document_ids, hidden=()):
        return {
            d: {
                "group_id": GROUPS[d],
                "count": 2,
                "keys": sorted(k for k, g in GROUPS.items() if g == GROUPS[d] and k != d),
            }
            for d in document_ids
            if d in GROUPS
        }

    monkeypatch.setattr(search_copies, "copies_of", copies_of)


def test_one_hit_per_group_best_first_and_a_deeper_look_when_copies_leave_too_few(groups, monkeypatch):
    asked = []

    def search(n):
        asked.append(n)
        return hits(n)

    monkeypatch.setattr(search_copies, "OVERFETCH", 2)  # a shallow first look: six candidates hold two groups
    _, kept, found = search_copies.collapsed_search(search, None, 3, all_copies=False)
    assert [h.payload["document_id"] for h in kept] == ["a1", "b1", "c"]
    assert asked == [6, 6 * search_copies.DEEPER]  # the deeper look goes DEEPER times as deep
    assert search_copies.also_in(kept[0], found) == {"also_in": 2, "also_in_keys": ["a2", "a3"]}
    assert search_copies.also_in(kept[2], found) == {}


def test_every_copy_with_all_copies(groups):
    _, kept, _ = search_copies.collapsed_search(hits, None, 4, all_copies=True)
    assert [h.payload["document_id"] for h in kept] == ["a1", "a2", "a3", "b1"]


def test_the_copy_shown_for_a_group_is_the_one_holding_the_querys_words(groups):
    texts = {
        "a1": "The reactor was shut down in March after the inspection.",
        "a2": "The reactor was shut down in April after the inspection.",  # a version: one word changed
        "a3": "The reactor was shut clown in April afler the inspection.",  # a re-scan read by OCR
        "b1": "Unrelated text about pumps.",
    }
    ranked = [SearchHit(1.0 - i / 100, f"chunk{i}", {"document_id": d, "text": texts[d]}) for i, d in enumerate(texts)]
    _, kept, _ = search_copies.collapsed_search(
        lambda n: ranked[:n], None, 2, all_copies=False, query="shut down in April after the inspection"
    )
    # the group keeps its place (first), shown by the version that holds "in April", not by the best-ranked a1
    assert [h.payload["document_id"] for h in kept] == ["a2", "b1"]
    # a query every copy holds alike keeps the search's own order
    _, kept, _ = search_copies.collapsed_search(
        lambda n: ranked[:n], None, 2, all_copies=False, query="The reactor was"
    )
    assert [h.payload["document_id"] for h in kept] == ["a1", "b1"]
    # every copy, in the search's order, with --all
    _, kept, _ = search_copies.collapsed_search(lambda n: ranked[:n], None, 4, all_copies=True, query="in April")
    assert [h.payload["document_id"] for h in kept] == ["a1", "a2", "a3", "b1"]


def test_best_copy_compares_single_words_when_the_query_has_one():
    from processing.copy_choice import best_copy

    assert best_copy("April", ["in March", "in April"], lambda t: t) == "in April"
    assert best_copy("", ["first", "second"], lambda t: t) == "first"
    assert best_copy("word", ["only"], lambda t: t) == "only"


def test_best_copy_reads_words_past_the_markup_of_a_text_layer_page():
    from processing.copy_choice import best_copy

    # the original's markdown holds emphasis and a tag its re-scan's OCR text does not; the version changed a word
    original = "TraceMonkey focuses on _loop traces_, that grow O(n<sup>k</sup>) in size."
    version = "TraceMonkey focuses on loop secart, that grow O(nk) in size."
    rescan = "TraceMonkey focuses on loop traces, that grow O(n k) in sise."
    query = "TraceMonkey focuses on loop traces , that grow O ( n k ) in size."
    # the re-scan ranked first; only the original holds every word pair of the query once markup is left out
    assert best_copy(query, [rescan, version, original], lambda t: t) == original


def test_a_copy_competes_with_its_best_few_hits_only(groups):
    query = "shut down in April"
    plain = "The reactor report, page two."
    ranked = [
        SearchHit(0.99, "a1-0", {"document_id": "a1", "text": "The reactor was shut down in March."}),
        *(SearchHit(0.98 - i / 100, f"a2-{i}", {"document_id": "a2", "text": plain}) for i in range(5)),
        SearchHit(0.90, "a2-5", {"document_id": "a2", "text": "The reactor was shut down in April."}),
        SearchHit(0.89, "b1-0", {"document_id": "b1", "text": "Unrelated text about pumps."}),
    ]
    _, kept, _ = search_copies.collapsed_search(lambda n: ranked[:n], None, 2, all_copies=False, query=query)
    # a2's sixth hit holds the words, but past its first COMPARED_PER_DOCUMENT: a1 and a2's best three tie
    assert [h.chunk_id for h in kept] == ["a1-0", "b1-0"]
    ranked.insert(3, ranked.pop(6))  # the same hit among a2's best three is compared, and chosen
    _, kept, _ = search_copies.collapsed_search(lambda n: ranked[:n], None, 2, all_copies=False, query=query)
    assert [h.chunk_id for h in kept] == ["a2-5", "b1-0"]


def test_light_looks_read_whole_payloads_only_for_the_hits_compared_and_kept(groups, monkeypatch):
    """The looks carry each hit's document alone; the texts compared and the payloads shown are read once, for
    each placed group's best few hits; a look holding fewer documents than places wanted needs no group look-up."""
    texts = {"a1": "shut down in March", "a2": "shut down in April", "a3": "shut clown in April", "b1": "pumps"}
    ranking = ["a1", "a2", "a1", "a2", "a1", "a1", "a3", "a1", "b1", "c"]
    whole = {f"chunk{i}": {"document_id": d, "text": texts.get(d, d)} for i, d in enumerate(ranking)}
    looks, read, looked_up = [], [], []

    def light(n):
        looks.append(n)
        return [SearchHit(1.0 - i / 100, f"chunk{i}", {"document_id": d}) for i, d in enumerate(ranking[:n])]

    def payloads(chunk_ids):
        read.append(list(chunk_ids))
        return {c: whole[c] for c in chunk_ids if c != "chunk9"}  # chunk9 deleted since the look

    copies_of = search_copies.copies_of

    def counted(engine, document_ids, hidden=()):
        looked_up.append(list(document_ids))
        return copies_of(engine, document_ids, hidden)

    monkeypatch.setattr(search_copies, "copies_of", counted)
    monkeypatch.setattr(search_copies, "OVERFETCH", 2)  # the first look: six hits of two documents
    monkeypatch.setattr(search_copies, "COMPARED_PER_DOCUMENT", 1)

    def never(n):
        raise AssertionError("a light collapse runs the light look")

    _, kept, found = search_copies.collapsed_search(
        never, None, 3, all_copies=False, query="down in April", light=light, payloads=payloads
    )
    # group A is shown by a2 (the query's words), b1 next; c's hit went away with its point
    assert [(h.chunk_id, h.payload) for h in kept] == [("chunk1", whole["chunk1"]), ("chunk8", whole["chunk8"])]
    assert looks == [6, 6 * search_copies.DEEPER]
    assert looked_up == [["a1", "a2", "a3", "b1", "c"]]  # once, after the deeper look
    # each copy's best hit (COMPARED_PER_DOCUMENT) of group A, then b1 and c: not the other a1 hits
    assert read == [["chunk0", "chunk1", "chunk6", "chunk8", "chunk9"]]
    assert search_copies.also_in(kept[0], found) == {"also_in": 2, "also_in_keys": ["a1", "a3"]}


def test_a_group_compares_a_bounded_number_of_hits(groups, monkeypatch):
    monkeypatch.setattr(search_copies, "COMPARED_PER_GROUP", 2)
    ranked = [SearchHit(1.0 - i / 100, f"chunk{i}", {"document_id": d}) for i, d in enumerate(["a1", "a2", "a3"])]
    assert search_copies.one_per_group(ranked, {d: {"group_id": "A"} for d in GROUPS}, 1, True) == [ranked[:2]]
    assert search_copies.one_per_group(ranked, {d: {"group_id": "A"} for d in GROUPS}, 1, False) == [ranked[:1]]


def test_the_looks_deepen_until_the_deepest_a_search_may_make_and_stop(groups):
    asked = []

    def one_group(n):  # every hit a copy of group A: no depth finds a second group
        asked.append(n)
        return [SearchHit(1.0 - i / 10_000, f"chunk{i}", {"document_id": f"a{1 + i % 3}"}) for i in range(n)]

    _, kept, _ = search_copies.collapsed_search(one_group, None, 5, all_copies=False)
    assert [h.payload["document_id"] for h in kept] == ["a1"]
    assert asked == [20, 200, MAX_SEARCH_LIMIT]


def ranked_store(ranking: list[str]):
    """A light look over `ranking` (one hit a document id, best first) and the same look leaving documents out,
    with each look recorded: a store whose scores do not depend on what else is ranked (dense or sparse)."""
    ranked = [SearchHit(1.0 - i / 1000, f"chunk{i}", {"document_id": d}) for i, d in enumerate(ranking)]
    looks: list[tuple] = []

    def light(n):
        looks.append((n,))
        return ranked[:n]

    def without(n, documents):
        looks.append((n, sorted(documents)))
        return [h for h in ranked if h.payload["document_id"] not in documents][:n]

    return light, without, looks


def collapsed(light, without, limit):
    def payloads(chunk_ids):
        return {c: {"document_id": "?"} for c in chunk_ids}

    _, kept, _ = search_copies.collapsed_search(
        None, None, limit, all_copies=False, light=light, payloads=payloads, without=without
    )
    return [h.chunk_id for h in kept]


def test_a_look_after_the_first_leaves_out_the_documents_seen_and_stays_shallow(groups, monkeypatch):
    looked_up = []
    copies_of = search_copies.copies_of

    def counted(engine, document_ids, hidden=()):
        looked_up.append(sorted(document_ids))
        return copies_of(engine, document_ids, hidden)

    monkeypatch.setattr(search_copies, "copies_of", counted)
    monkeypatch.setattr(search_copies, "OVERFETCH", 2)
    # a family's copies hold the first 30 places: the next groups are far down a ranking taken whole
    ranking = ["a1", "a2", "a3"] * 10 + ["b1", "c", "a1", "b2", "d", "e"] + ["f"] * 100
    light, without, looks = ranked_store(ranking)
    kept = collapsed(light, without, 4)
    # the second look leaves out the family's documents, as shallow as the first; one group look-up for both
    assert looks == [(8,), (8, ["a1", "a2", "a3"])]
    assert looked_up == [["a1", "a2", "a3", "b1", "b2", "c", "d", "e", "f"]]
    # the same hits as the deeper looks of the whole ranking give
    light, _, deep_looks = ranked_store(ranking)
    assert kept == collapsed(light, None, 4) == ["chunk0", "chunk30", "chunk31", "chunk34"]
    assert deep_looks == [(8,), (80,)]


def test_a_document_left_out_that_stands_alone_is_looked_at_again(groups, monkeypatch):
    monkeypatch.setattr(search_copies, "OVERFETCH", 2)
    # c is in no group: each of its hits is a place of its own, which leaving it out would lose
    ranking = ["c", "a1", "c", "a2"] * 3 + ["b1", "c", "d", "e"] * 3
    light, without, looks = ranked_store(ranking)
    kept = collapsed(light, without, 5)
    assert looks == [(10,), (10, ["a1", "a2", "c"]), (10, ["a1", "a2"])]
    light, _, _ = ranked_store(ranking)
    assert kept == collapsed(light, None, 5) == ["chunk0", "chunk1", "chunk2", "chunk4", "chunk6"]


def test_looks_leaving_documents_out_are_bounded_then_go_deeper(groups, monkeypatch):
    monkeypatch.setattr(search_copies, "OVERFETCH", 1)
    # one group of many documents, each with many hits: every look brings new copies, never a second group
    many = {f"a{i}": "A" for i in range(4, 204)}
    monkeypatch.setattr(
        search_copies,
        "copies_of",
        lambda engine, ids, hidden=(): {d: {"group_id": "A", "count": 1, "keys": []} for d in ids if d in many},
    )
    ranking = [f"a{4 + i // 3}" for i in range(600)] + ["c"]
    light, without, looks = ranked_store(ranking)
    kept = collapsed(light, without, 2)
    narrowed = looks[1 : 1 + search_copies.NARROW_LOOKS]
    assert looks[0] == (2,) and all(len(look) == 2 and look[0] == 2 for look in narrowed)
    assert looks[1 + search_copies.NARROW_LOOKS :] == [(20,), (200,), (MAX_SEARCH_LIMIT,)]
    assert kept == ["chunk0", "chunk600"]


def test_a_narrowed_looks_hits_follow_without_repeats_and_never_outscore_those_before():
    before = [SearchHit(0.03, "chunk0", {"document_id": "a1"}), SearchHit(0.02, "chunk1", {"document_id": "c"})]
    # fused ranks among fewer candidates score higher than the hits before them
    more = [SearchHit(0.033, "chunk1", {"document_id": "c"}), SearchHit(0.032, "chunk7", {"document_id": "d"})]
    followed = search_copies._followed(before, more)
    assert [(h.chunk_id, h.score) for h in followed] == [("chunk0", 0.03), ("chunk1", 0.02), ("chunk7", 0.02)]
