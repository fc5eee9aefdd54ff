"""The graph adapter's former module path, kept for orchestration modules that still import it.

The adapter is resources/bolt_graph.py, its Dagster resource resources/graph_stores.py, its rules
processing/entities.py. Import from those.
"""
from processing.entities import (
    ChunkGraph,
    Entity,
    Extraction,
    Relation,
    normalize_entity_name,
)
from resources.bolt_graph import GraphStore
from resources.graph_stores import Neo4jResource

__all__ = ["ChunkGraph", "Entity", "Extraction", "GraphStore", "Neo4jResource", "Relation", "normalize_entity_name"]
