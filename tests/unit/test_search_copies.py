"""Collapsing copies in search (resources/search_copies.py), on stand-in hits and groups: one hit per content group,
best first; a deeper look when copies leave too few; every hit with `all_copies`."""

from __future__ import annotations

import pytest

from resources import search_copies
from resources.ports import SearchHit

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
    assert asked == [6, 12]
    assert search_copies.also_in(kept[0], found) == {"also_in": 2, "also_in_keys": ["a2", "a3"]}
    assert search_copies.also_in(kept[2], found) == {}


def test_every_copy_with_all_copies(groups):
    _, kept, _ = search_copies.collapsed_search(hits, None, 4, all_copies=True)
    assert [h.payload["document_id"] for h in kept] == ["a1", "a2", "a3", "b1"]
