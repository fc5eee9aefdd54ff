"""Every adapter offers each member of its port (resources/ports.py), checked on the classes, without a store."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from resources import ports
from resources.bolt_graph import GraphStore as BoltGraphStore
from resources.embeddings import Embedder
from resources.extraction import SpacyExtractor
from resources.llm_extraction import LlmExtractor
from resources.qdrant_edge import EdgeVectorStore
from resources.qdrant_server import ClientVectorStore
from resources.s3_bucket import S3Bucket
from resources.storage import LocalStorage
from resources.vector_resource import PLAIN_FIELDS, QdrantResource
from resources.vector_stores import ADAPTERS


def members(protocol) -> set[str]:
    """The methods and attributes the Protocol's body declares."""
    declared = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return {name for name in declared if not name.startswith("_") or name in ("__enter__", "__exit__")}


@pytest.mark.parametrize(
    "protocol, adapter",
    [
        (ports.VectorStore, EdgeVectorStore),
        (ports.VectorStore, ClientVectorStore),
        (ports.GraphStore, BoltGraphStore),
        (ports.Embedder, Embedder),
        (ports.Extractor, SpacyExtractor),
        (ports.Extractor, LlmExtractor),
        (ports.FileStore, LocalStorage),
        (ports.ObjectSource, S3Bucket),
    ],
)
def test_each_adapter_has_every_member_of_its_port(protocol, adapter):
    instance_attributes = {"model_id", "dim", "location", "name"}  # set in __init__
    missing = {name for name in members(protocol) if not hasattr(adapter, name) and name not in instance_attributes}
    assert not missing, f"{adapter.__name__} lacks {sorted(missing)} of {protocol.__name__}"
    for name in members(protocol) - instance_attributes:
        if inspect.isfunction(getattr(protocol, name, None)) and inspect.isfunction(getattr(adapter, name, None)):
            wanted = [
                p.name
                for p in inspect.signature(getattr(protocol, name)).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            offered = inspect.signature(getattr(adapter, name)).parameters
            assert all(p in offered for p in wanted), (adapter.__name__, name, wanted, list(offered))


def test_every_vector_adapter_is_chosen_by_one_line_of_the_factory():
    chosen = [adapter() for _applies, adapter in ADAPTERS]
    assert chosen == [ClientVectorStore, EdgeVectorStore]
    settings = ports.VectorStoreSettings(url="https://user:secret@qdrant.example:6333", api_key="k", path="/nowhere")
    assert "secret" not in repr(settings) and "'k'" not in repr(settings)
    assert next(adapter for applies, adapter in ADAPTERS if applies(settings))() is ClientVectorStore
    assert (
        next(adapter for applies, adapter in ADAPTERS if applies(ports.VectorStoreSettings(path="/x")))()
        is EdgeVectorStore
    )


def test_the_vector_resource_carries_exactly_the_store_settings():
    """QdrantResource copies VectorStoreSettings field by field (PLAIN_FIELDS): a setting added to one and not the
    other would silently stay at its default in every Dagster run."""
    assert set(QdrantResource.model_fields) == {f.name for f in dataclasses.fields(ports.VectorStoreSettings)}
    assert set(PLAIN_FIELDS) == set(QdrantResource.model_fields) - {"url", "api_key"}
