"""The graph adapter's former module path, kept for orchestration modules that still import it.

The adapter is resources/bolt_graph.py; its rules are processing/entities.py. Import from those.
"""
from processing.entities import ChunkGraph, Entity, Extraction, Relation, normalize_entity_name
from resources.bolt_graph import GraphStore, Neo4jResource

__all__ = ["ChunkGraph", "Entity", "Extraction", "GraphStore", "Neo4jResource", "Relation", "normalize_entity_name"]
