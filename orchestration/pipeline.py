"""The processing of each task kind, as plain functions over claimed tasks: the same code runs inside the Dagster
assets and in the plain loop the orchestration benchmark compares them with.

Every function takes tasks already claimed by `worker_id`, does the work, and completes or fails each task
through the queue (fenced: a task recovered and re-claimed elsewhere meanwhile is not overwritten). It returns
one `Outcome` per task and never raises for a task's own failure: a bad file fails its task with a readable
reason and the batch goes on.
"""

from __future__ import annotations

import logging
import time
from functools import cached_property
from typing import Sequence

from orchestration.failures import classify, within
from orchestration.page_reading import PageReader
from orchestration.task_outcomes import (
    Outcome,
    PageLimits,
    VectorCopy,
    batch_then_one_by_one,
    json_safe,
    textless_outcome,
    write_chunked_pages,
)
from processing.chunking import chunk_markdown
from processing.entities import ChunkGraph
from queue_db.config import Settings, default
from queue_db.embedding_reuse import embedded_chunks_by_hash
from queue_db.keys import page_partition_key
from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, OCR_PAGE, VECTOR_CHUNK, VECTOR_PAGE, TaskKind
from queue_db.queue import TaskQueue
from queue_db.service_config import EmbeddingConfig, ExtractionConfig
from resources.ports import ChunkPoint
from resources.storage import page_file_key
from resources.vector_payload import chunk_payload

log = logging.getLogger(__name__)


class Pipeline:
    """Plain clients for every external system, created lazily (a worker that only embeds never loads spaCy)."""

    def __init__(
        self,
        queue: TaskQueue,
        *,
        storage=None,
        pdf=None,
        embedder=None,
        vector_store_factory=None,
        graph_store=None,
        extractor=None,
        embed_dedup: bool = default(EmbeddingConfig, "dedup"),
        embed_timeout_s: float = default(EmbeddingConfig, "timeout_s"),
        extract_timeout_s: float = default(ExtractionConfig, "timeout_s"),
        limits: PageLimits = PageLimits(),
    ):
        self.queue = queue
        self.limits = limits
        # DOCQUEUE_EMBEDDING_DEDUP, DOCQUEUE_EMBED_TIMEOUT and DOCQUEUE_EXTRACT_TIMEOUT, as the resources carry them
        self.embed_dedup, self.embed_timeout_s, self.extract_timeout_s = embed_dedup, embed_timeout_s, extract_timeout_s
        self._storage, self._pdf, self._embedder = storage, pdf, embedder
        self._vector_store_factory, self._graph, self._extractor = vector_store_factory, graph_store, extractor
        self.page_reader = PageReader(storage, pdf, limits.text, limits.office)

    @classmethod
    def from_resources(
        cls,
        queue: TaskQueue,
        storage,
        ocr=None,
        embeddings=None,
        qdrant=None,
        neo4j=None,
        extraction=None,
        limits: PageLimits = PageLimits(),
    ) -> "Pipeline":
        """A pipeline over a run's Dagster resources. Only the phases whose resources are given can run; models and
        stores are opened on first use, so a run that never needs one never pays for it."""
        return cls(
            queue,
            storage=storage.get_storage(),
            pdf=ocr.get_processor() if ocr is not None else None,
            embedder=_Lazy(embeddings.get_embedder) if embeddings is not None else None,
            vector_store_factory=(
                (lambda model_id, dim: qdrant.get_store(model_id, dim)) if qdrant is not None else None
            ),
            graph_store=_Lazy(neo4j.get_store) if neo4j is not None else None,
            extractor=_Lazy(extraction.get_extractor) if extraction is not None else None,
            **(
                {"embed_dedup": embeddings.dedup, "embed_timeout_s": embeddings.timeout_s}
                if embeddings is not None
                else {}
            ),
            **({"extract_timeout_s": extraction.timeout_s} if extraction is not None else {}),
            limits=limits,
        )

    @classmethod
    def from_settings(cls, queue: TaskQueue, settings: Settings) -> "Pipeline":
        """Every phase, with resources built from an entry point's settings (the plain loop outside Dagster)."""
        from resources.embedding_resource import EmbeddingResource
        from resources.extraction import ExtractionResource
        from resources.graph_stores import Neo4jResource
        from resources.ocr_resource import OcrResource
        from resources.storage_resource import StorageResource
        from resources.vector_resource import QdrantResource

        return cls.from_resources(
            queue,
            StorageResource.from_settings(settings),
            ocr=OcrResource.from_settings(settings),
            embeddings=EmbeddingResource.from_settings(settings),
            qdrant=QdrantResource.from_settings(settings),
            neo4j=Neo4jResource.from_settings(settings),
            extraction=ExtractionResource.from_settings(settings),
            limits=PageLimits.from_config(settings.storage),
        )

    @property
    def storage(self):
        return self._storage

    @property
    def pdf(self):
        return self._pdf

    @property
    def embedder(self):
        return _resolve(self._embedder)

    @cached_property
    def vector_store(self):
        embedder = self.embedder
        store = self._vector_store_factory(embedder.model_id, embedder.dim)
        store.ensure_collection()
        return store

    @property
    def graph(self):
        return _resolve(self._graph)

    @property
    def extractor(self):
        return _resolve(self._extractor)

    def close(self) -> None:
        for name in ("_pdf",):
            client = getattr(self, name, None)
            if client is not None and hasattr(client, "close"):
                client.close()
        if "vector_store" in self.__dict__:
            self.__dict__["vector_store"].close()

    # ------------------------------------------------------------------------------------------ helpers
    def _taken_from_us(self, kind: TaskKind, worker_id: str, tasks: Sequence[dict]) -> set[str]:
        """Ids of tasks recovered and handed to another worker while we worked on them (a stalled or paused
        worker waking up late): their side effects must not be written over the new owner's. Also a heartbeat."""
        ids = [str(t["id"]) for t in tasks]
        return set(ids) - self.queue.heartbeat(kind, worker_id, ids)

    def _finish(
        self, kind: TaskKind, worker_id: str, outcomes: list[Outcome], results: dict[str, dict]
    ) -> list[Outcome]:
        done = [o for o in outcomes if o.ok and not o.rejected]
        failed = [o for o in outcomes if not o.ok and not o.rejected]
        rejected: set[str] = set()
        if done and kind not in (OCR_DOCUMENT, VECTOR_PAGE):
            rejected |= set(
                self.queue.complete(kind, worker_id, [{"id": o.id, **results.get(o.id, {})} for o in done]).rejected
            )
        if failed:
            rejected |= set(
                self.queue.fail(
                    kind,
                    worker_id,
                    [
                        {"id": o.id, "error": o.error, "error_class": o.error_class, "retryable": o.retryable}
                        for o in failed
                    ],
                ).rejected
            )
        for outcome in outcomes:
            outcome.rejected = outcome.rejected or outcome.id in rejected
        return outcomes

    # ------------------------------------------------------------------------------------------ phase 1: OCR
    def expand_documents(self, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        """OCR at document level: open the document, count its pages, create one page task per page. PDFs,
        images, EPUB and XPS are opened by the OCR worker; text, Markdown and HTML are split into pages here."""
        outcomes = []
        for task in tasks:
            started = time.perf_counter()
            try:
                document = self.queue.document(task["id"])
                info = self.page_reader.inspect(document)
                engine = {"engine": info.engine} if info.engine else {}  # only the PDF worker's types have one
                accepted = self.queue.complete_document_expansion(
                    worker_id,
                    task["id"],
                    page_count=info.page_count,
                    encrypted=info.encrypted,
                    metadata={
                        "boilerplate": list(info.boilerplate),
                        "repaired": info.repaired,
                        "pdf": json_safe(info.metadata),
                        **engine,
                    },
                )
                outcomes.append(
                    Outcome(
                        task["id"],
                        True,
                        rejected=not accepted,
                        metadata={
                            "pages": info.page_count,
                            "encrypted": info.encrypted,
                            "repaired": info.repaired,
                            **engine,
                            "seconds": round(time.perf_counter() - started, 3),
                        },
                    )
                )
            except Exception as exc:  # noqa: BLE001 - one document's failure must not stop the batch
                reason, error_class, retryable = classify(exc)
                outcomes.append(Outcome(task["id"], False, reason, error_class, retryable))
        return self._finish(OCR_DOCUMENT, worker_id, outcomes, {})

    def ocr_pages(self, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        """OCR at page level: page -> markdown (text layer or OCR), headers/footers removed, stored as _nohf.md."""
        outcomes, results, documents = [], {}, {}
        for task in tasks:
            try:
                document = documents.get(task["document_id"]) or self.queue.document(task["document_id"])
                documents[task["document_id"]] = document
                result = self.page_reader.convert_page(document, task["page_number"])
                key = page_file_key(document["document_key"], task["page_number"])
                self.storage.put_text(key, result.markdown)
                results[task["id"]] = {
                    "page_file_path": key,
                    "ocr_method": result.method,
                    "ocr_chars": result.chars,
                    "ocr_seconds": round(result.seconds, 3),
                }
                outcomes.append(
                    Outcome(
                        task["id"],
                        True,
                        metadata={
                            "method": result.method,
                            "characters": result.chars,
                            "seconds": round(result.seconds, 3),
                        },
                    )
                )
            except Exception as exc:  # noqa: BLE001
                reason, error_class, retryable = classify(exc)
                outcomes.append(Outcome(task["id"], False, reason, error_class, retryable))
        return self._finish(OCR_PAGE, worker_id, outcomes, results)

    # ------------------------------------------------------------------------------------------ phase 2: vectors
    def chunk_pages(self, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        """Vector at page level: the page's markdown -> deterministic chunks -> chunk tasks, the batch's pages
        written in one transaction (a page's own transaction cost more than its chunking; write_chunked_pages)."""
        outcomes: dict[str, Outcome] = {}
        chunked: dict[str, list[dict]] = {}
        documents: dict[str, dict] = {}
        for task in tasks:
            started = time.perf_counter()
            try:
                document = documents.get(task["document_id"]) or self.queue.document(task["document_id"])
                documents[task["document_id"]] = document
                markdown = self.storage.get_text(task["page_file_path"]) if task.get("page_file_path") else ""
                chunks = chunk_markdown(
                    markdown,
                    page_key=page_partition_key(document["document_key"], task["page_number"]),
                    max_chunks=self.limits.max_chunks_per_page,
                )
                chunked[str(task["id"])] = [
                    {
                        "chunk_id": c.chunk_id,
                        "chunk_index": c.index,
                        "content_hash": c.content_hash,
                        "content": c.text,
                        "token_count": c.token_count,
                    }
                    for c in chunks
                ]
                metadata = {
                    "chunks": len(chunks),
                    "tokens": sum(c.token_count for c in chunks),
                    "seconds": round(time.perf_counter() - started, 3),
                }
                outcomes[str(task["id"])] = Outcome(task["id"], True, metadata=metadata)
            except Exception as exc:  # noqa: BLE001
                reason, error_class, retryable = classify(exc)
                outcomes[str(task["id"])] = Outcome(task["id"], False, reason, error_class, retryable)
        for page, written in write_chunked_pages(self.queue, worker_id, chunked).items():
            if written.ok:
                outcomes[page].rejected = written.rejected
            else:  # the page's own write failed
                outcomes[page] = written
        return self._finish(VECTOR_PAGE, worker_id, [outcomes[str(t["id"])] for t in tasks], {})

    def embed_chunks(self, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        """Vector at chunk level: embed a batch and upsert it into Qdrant (point id = uuid5(chunk_id))."""
        return self._settle_batch(VECTOR_CHUNK, worker_id, tasks, self._embed_batch)

    def _embed_batch(self, worker_id: str, tasks: Sequence[dict]) -> tuple[list[Outcome], dict[str, dict]]:
        started = time.perf_counter()
        context = self.queue.chunk_context([t["id"] for t in tasks])
        copies = self._reusable_vectors(tasks) if self.embed_dedup else {}
        fresh = [i for i in range(len(tasks)) if i not in copies]
        embedded = (
            within(
                self.embed_timeout_s,
                "embedding",
                lambda: self.embedder.embed_covered([tasks[i].get("content") or "" for i in fresh]),
            )
            if fresh
            else None
        )
        vectors, tokens, covered = [None] * len(tasks), [0] * len(tasks), [0] * len(tasks)
        for row, i in enumerate(fresh):
            vectors[i], tokens[i], covered[i] = (
                embedded.vectors[row],
                embedded.tokens[row],
                embedded.embedded_tokens[row],
            )
        for i, copy in sorted(copies.items()):  # a copy of an earlier task of this batch comes after that task
            if copy.batch_index is not None:
                copy = copy.of(vectors[copy.batch_index], tokens[copy.batch_index], covered[copy.batch_index])
            vectors[i], tokens[i], covered[i] = copy.vector, copy.tokens, copy.embedded_tokens
        points = [
            ChunkPoint(
                chunk_id=t["chunk_id"],
                vector=vectors[i],
                payload=chunk_payload(
                    document_id=context[t["id"]]["document_id"],
                    document_key=context[t["id"]]["document_key"],
                    tenant_id=context[t["id"]]["tenant_id"],
                    filename=context[t["id"]]["filename"],
                    page_number=context[t["id"]]["page_number"],
                    chunk_index=t["chunk_index"],
                    text=t.get("content") or "",
                    content_hash=t["chunk_content_hash"],
                    tokens=tokens[i],
                    embedded_tokens=covered[i],
                    vector_reused_from=copies[i].source if i in copies else None,
                ),
            )
            for i, t in enumerate(tasks)
        ]
        lost = self._taken_from_us(VECTOR_CHUNK, worker_id, tasks)
        self.vector_store.upsert([p for p, t in zip(points, tasks) if str(t["id"]) not in lost])
        seconds = (time.perf_counter() - started) / len(tasks)
        outcomes = [
            Outcome(
                t["id"],
                True,
                rejected=str(t["id"]) in lost,
                metadata={
                    "vectors": 1,
                    "dimensions": len(vectors[i]),
                    "seconds": round(seconds, 4),
                    "tokens": tokens[i],
                    "embedded_tokens": covered[i],
                    "reused": i in copies,
                },
            )
            for i, t in enumerate(tasks)
        ]
        return outcomes, {
            t["id"]: {"vector_seconds": seconds, "vector_reused_from": copies[i].source if i in copies else None}
            for i, t in enumerate(tasks)
        }

    def _reusable_vectors(self, tasks: Sequence[dict]) -> dict[int, "VectorCopy"]:
        """Tasks of the batch whose text already has a vector: an identical chunk embedded before, whose point the
        store (the model's own collection) still holds and which covers its whole text, or an earlier task of this
        batch. The rest are embedded; a source point missing from the store only means embedding as usual."""
        hashes = [t.get("chunk_content_hash") for t in tasks]
        sources = embedded_chunks_by_hash(self.queue.engine, hashes)
        stored = self.vector_store.vectors(list(dict.fromkeys(sources.values()))) if sources else {}
        copies, first_of_text = {}, {}
        for i, content_hash in enumerate(hashes):
            if not content_hash:
                continue
            point = stored.get(sources.get(content_hash))
            if (
                point is not None
                and point.payload.get("content_hash") == content_hash
                and point.payload.get("tokens") is not None
                and point.payload.get("tokens") == point.payload.get("embedded_tokens")
            ):
                copies[i] = VectorCopy(
                    sources[content_hash], point.vector, point.payload["tokens"], point.payload["embedded_tokens"]
                )
            elif content_hash in first_of_text:
                first = first_of_text[content_hash]
                copies[i] = VectorCopy(tasks[first]["chunk_id"], batch_index=first)
            else:
                first_of_text[content_hash] = i
        return copies

    # ------------------------------------------------------------------------------------------ phase 3: graph
    def extract_chunks(self, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
        """GraphRAG at chunk level: entities and relationships of a batch, merged into the graph."""
        return self._settle_batch(GRAPHRAG_CHUNK, worker_id, tasks, self._extract_batch)

    def _extract_batch(self, worker_id: str, tasks: Sequence[dict]) -> tuple[list[Outcome], dict[str, dict]]:
        started = time.perf_counter()
        context = self.queue.chunk_context([t["id"] for t in tasks])
        extractions = within(
            self.extract_timeout_s,
            "extraction",
            lambda: self.extractor.extract([t.get("content") or "" for t in tasks]),
        )
        lost = self._taken_from_us(GRAPHRAG_CHUNK, worker_id, tasks)
        self.graph.write_chunks(
            [
                ChunkGraph(
                    document_id=context[t["id"]]["document_id"],
                    filename=context[t["id"]]["filename"],
                    page_number=context[t["id"]]["page_number"],
                    chunk_id=t["chunk_id"],
                    chunk_index=t["chunk_index"],
                    extraction=extractions[i],
                    tenant_id=context[t["id"]]["tenant_id"],
                )
                for i, t in enumerate(tasks)
                if str(t["id"]) not in lost
            ]
        )
        seconds = (time.perf_counter() - started) / len(tasks)
        outcomes, results = [], {}
        for i, t in enumerate(tasks):
            entities, relations = len(extractions[i].entities), len(extractions[i].relations)
            results[t["id"]] = {
                "entities_extracted": entities,
                "relationships_extracted": relations,
                "graphrag_seconds": seconds,
            }
            outcomes.append(
                Outcome(
                    t["id"],
                    True,
                    rejected=str(t["id"]) in lost,
                    metadata={"entities": entities, "relationships": relations, "seconds": round(seconds, 4)},
                )
            )
        return outcomes, results

    # ------------------------------------------------------------------------------------------ batches
    def _settle_batch(self, kind: TaskKind, worker_id: str, tasks: Sequence[dict], work) -> list[Outcome]:
        """Run `work` over a batch of chunk tasks (batch_then_one_by_one: one bad chunk fails alone) and settle them."""
        if not tasks:
            return []
        textless = [t for t in tasks if not (t.get("content") or "").strip()]
        if textless:  # nothing to embed or extract: never send an empty text to the model
            skipped = {str(t["id"]) for t in textless}
            return [
                *self._finish(kind, worker_id, [textless_outcome(t) for t in textless], {}),
                *self._settle_batch(kind, worker_id, [t for t in tasks if str(t["id"]) not in skipped], work),
            ]
        outcomes, results = batch_then_one_by_one(worker_id, tasks, work)
        return self._finish(kind, worker_id, outcomes, results)


class _Lazy:
    def __init__(self, factory):
        self.factory, self.value, self.made = factory, None, False

    def get(self):
        if not self.made:
            self.value, self.made = self.factory(), True
        return self.value


def _resolve(value):
    return value.get() if isinstance(value, _Lazy) else value
