"""The documents of points read before, which the embedded store's deep looks read instead of the payload store
(resources/qdrant_edge_search.py): bounded, the first recorded forgotten first."""

from __future__ import annotations

import uuid

from resources.qdrant_edge_search import Owners, _key


def test_owners_keep_a_bounded_number_of_points_the_first_recorded_forgotten_first():
    owners = Owners(kept=2)
    owners.add(1, {"chunk_id": "c1", "document_id": "d1", "text": "not kept"})
    owners.add(2, {"chunk_id": "c2", "document_id": "d2"})
    assert owners.get(1) == {"chunk_id": "c1", "document_id": "d1"}
    owners.add(3, {"chunk_id": "c3", "document_id": "d3"})
    assert (owners.get(1), len(owners)) == (None, 2)
    assert owners.get(3) == {"chunk_id": "c3", "document_id": "d3"}
    owners.add(4, {"chunk_id": "c4"})  # a payload naming no document is not kept
    assert owners.get(4) is None


def test_a_point_key_is_its_uuids_number_or_its_own():
    point = uuid.uuid5(uuid.NAMESPACE_URL, "chunk")
    assert _key(point) == point.int and _key(uuid.UUID(str(point))) == _key(point)
    assert _key(42) == 42
    assert _key(point) > 2**64  # never a point number's
