"""The vector store's former module path, kept for orchestration modules that still import it.

The port is resources/ports.py, the resource and the factory resources/vector_stores.py, the adapters
resources/qdrant_edge.py and resources/qdrant_server.py. Import from those.
"""
from resources.folder_lock import QdrantStorageBusy
from resources.ports import VectorStoreError
from resources.vector_stores import QdrantResource

__all__ = ["QdrantResource", "QdrantStorageBusy", "VectorStoreError"]
