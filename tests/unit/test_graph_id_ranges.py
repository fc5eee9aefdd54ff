"""How the graph is walked for verification: bounded ranges of ids that together cover every id once, in order."""

from __future__ import annotations

import hashlib

from resources.bolt_graph import GraphStore


def store_over(ids: list[str]) -> tuple[GraphStore, list[tuple[str, str | None]]]:
    """A GraphStore whose reads answer the two range queries chunk_id_pages sends from `ids` (and record them)."""
    store, queries = GraphStore.__new__(GraphStore), []

    def read(query: str, lower: str, upper: str | None = None) -> list[dict]:
        assert "ORDER BY" not in query and "LIMIT" not in query  # the server's slow path
        queries.append((lower, upper))
        return [{"id": i} for i in ids if i >= lower and (upper is None or i < upper)]

    store._read = read
    return store, queries


def test_every_id_once_in_order_in_bounded_pages_with_few_queries():
    ids = [hashlib.sha256(str(n).encode()).hexdigest()[:32] for n in range(20_000)]
    odd = ["", "chunk-7", "ZZ", "g-after-the-hex-digits", "ffffffffffffffffffffffffffffffffff"]
    store, queries = store_over(ids + odd)
    pages = list(store.chunk_id_pages(500))
    walked = [i for page in pages for i in page]
    assert walked == sorted(ids + odd)
    assert all(0 < len(page) <= 500 for page in pages)
    # about one query a page once the width has settled, not one per id or a walk from the start each time
    assert len(queries) <= 2 * len(ids) / 500 + 40, len(queries)


def test_an_empty_or_tiny_graph_takes_a_handful_of_queries():
    store, queries = store_over([])
    assert list(store.chunk_id_pages(1000)) == [] and len(queries) <= 5
    store, queries = store_over(["0" * 32, "f" * 32])
    assert [i for page in store.chunk_id_pages(1000) for i in page] == ["0" * 32, "f" * 32] and len(queries) <= 5
