"""The graph adapter (resources/ports.GraphStore), through the official `neo4j` driver: Neo4j 5 or any Bolt server
speaking its Cypher (resources/bolt_cypher.py).

Graph model:
    (:Document {id, filename, tenant_id})-[:HAS_PAGE]->(:Page {id, document_id, number, tenant_id})
        -[:HAS_CHUNK]->(:Chunk {id, document_id, page_number, index, tenant_id})
        -[:MENTIONS {aliases, tenant_id}]->(:Entity {key, name, type, tenant_id})
    (:Entity)-[:RELATED_TO {type, weight, chunk_ids}]->(:Entity)

One real-world entity is one node: its `key` is the normalised name (processing/entities.py) under a uniqueness
constraint. Outside the tenant `default` the key is prefixed `<tenant>:` (queue_db/tenants.py), so two tenants never
share an entity node; nodes written before tenants carry no tenant_id and are `default`'s. Within one document a short
form of a fuller name is that entity: the chunk MENTIONS the full name's node and the edge's `aliases` lists the short
keys it used. A RELATED_TO edge is one per (source, target, type); its `chunk_ids` is the set of chunks that state it
and `weight` is the size of that set.

Every write runs inside a managed transaction (`session.execute_write`, which retries transient errors). Writing a
chunk that already exists *replaces* its contribution: mentions and relation chunk ids it no longer has are removed
first, in the same transaction, so a retried (possibly non-deterministic, e.g. LLM) extraction never leaves stale
entities behind.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from processing.entities import ChunkGraph, Entity, normalize_entity_name, resolve_aliases
from processing.graph_content import DocumentAliases, chunk_content, chunk_keys, last_write_wins
from queue_db.config import default
from queue_db.service_config import GraphConfig
from queue_db.tenants import BASE_TENANT, bare_entity_key, tenant_entity_key
from resources import bolt_cypher as cypher
from resources.bolt_driver import neo4j
from resources.ports import ChunkEntities, GraphStoreUnavailable, MentionedEntity, RelatedEntity

BATCH_SIZE = default(GraphConfig, "batch_size")
TX_TIMEOUT_S = default(GraphConfig, "tx_timeout_s")
CONFLICT_RETRIES = default(GraphConfig, "conflict_retries")

# keys are whitespace-collapsed, so a newline can never occur inside one: safe as a separator in relation signatures
_SIG_SEP = "\n"


def page_id(document_id: str, page_number: int) -> str:
    return f"{document_id}#p{page_number}"


# chunk ids are 32 hex digits (queue_db.keys.chunk_id): the space chunk_id_pages cuts into ranges
_ID_SPACE = 16**32


# -- batching ----------------------------------------------------------------------------------------------------------
def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class _Batch:
    chunk_ids: list[str]
    documents: list[dict]
    pages: list[dict]
    chunks: list[dict]
    entities: list[dict]
    mentions: list[dict]
    relations: list[dict]
    keep: list[dict]  # per chunk: the mention keys and relation signatures it still has

    @classmethod
    def of(cls, chunks: list[ChunkGraph], aliases: dict[str, DocumentAliases] | None = None) -> "_Batch":
        """`aliases`: per document id, what its short forms resolve to (none resolve without it)."""
        pages: dict[str, dict] = {}
        rows, mentions, keep = [], [], []
        entities: dict[str, dict] = {}
        relations: dict[tuple[str, str, str], set[str]] = {}
        for chunk in chunks:
            content = chunk_content(chunk, (aliases or {}).get(chunk.document_id))
            pid = page_id(chunk.document_id, chunk.page_number)
            pages[pid] = {
                "id": pid,
                "document_id": chunk.document_id,
                "number": chunk.page_number,
                "tenant_id": chunk.tenant_id,
            }
            rows.append(
                {
                    "id": chunk.chunk_id,
                    "page_id": pid,
                    "document_id": chunk.document_id,
                    "page_number": chunk.page_number,
                    "index": chunk.chunk_index,
                    "tenant_id": chunk.tenant_id,
                }
            )
            for key, entity in content.entities.items():
                entities.setdefault(
                    key, {"key": key, "name": entity.name, "type": entity.type, "tenant_id": chunk.tenant_id}
                )
                mentions.append(
                    {
                        "chunk_id": chunk.chunk_id,
                        "key": key,
                        "aliases": content.aliases.get(key, []),
                        "tenant_id": chunk.tenant_id,
                    }
                )
            for signature in content.relations:
                relations.setdefault(signature, set()).add(chunk.chunk_id)
            keep.append(
                {
                    "chunk_id": chunk.chunk_id,
                    "keep_keys": sorted(content.entities),
                    "keep_relations": sorted(_SIG_SEP.join(sig) for sig in content.relations),
                }
            )
        # sorted so concurrent writers touch shared nodes in the same order
        return cls(
            chunk_ids=[row["id"] for row in rows],
            documents=_document_rows(chunks),
            pages=sorted(pages.values(), key=lambda r: r["id"]),
            chunks=rows,
            entities=sorted(entities.values(), key=lambda r: r["key"]),
            mentions=mentions,
            relations=[
                {"source": s, "target": t, "type": ty, "chunk_ids": sorted(ids)}
                for (s, t, ty), ids in sorted(relations.items())
            ],
            keep=keep,
        )


def _document_rows(chunks: list[ChunkGraph]) -> list[dict]:
    # sorted so concurrent writers lock documents in the same order
    named = {c.document_id: (c.filename, c.tenant_id) for c in chunks}
    return [{"id": did, "filename": name, "tenant_id": tenant} for did, (name, tenant) in sorted(named.items())]


# -- transaction bodies (run inside execute_write; may be retried, so they must be idempotent) -------------------------
def _detach_chunks(tx, keep: list[dict]) -> set[str]:
    """Remove what these chunks no longer state; returns the keys of entities that lost a mention or relation."""
    relation_rows = [{"chunk_id": row["chunk_id"], "keep": row["keep_relations"]} for row in keep]
    touched = {rec["entity_key"] for rec in tx.run(cypher.DETACH_RELATIONS, rows=relation_rows, sep=_SIG_SEP)}
    if touched:
        tx.run(cypher.DELETE_EMPTY_RELATIONS, keys=sorted(touched)).consume()
    mention_rows = [{"chunk_id": row["chunk_id"], "keep": row["keep_keys"]} for row in keep]
    return touched | {rec["entity_key"] for rec in tx.run(cypher.DETACH_MENTIONS, rows=mention_rows)}


def _document_aliases(written_rows: list[dict], chunks: list[ChunkGraph]) -> tuple[DocumentAliases, set[str]]:
    """One document's alias resolution over what its other chunks already mention (`written_rows`, from
    cypher.DOCUMENT_ENTITIES) plus these chunks, and the keys of entities its other chunks mention that now resolve to a
    fuller name (their mentions must move)."""
    known: dict[str, Entity] = {}
    pairs: set[tuple[str, str]] = set()
    recorded: dict[str, str] = {}
    written: set[str] = set()
    for rec in written_rows:
        known.setdefault(
            rec["key"], Entity(name=rec["name"] or rec["key"], type=rec["type"] or "OTHER", key=rec["key"])
        )
        pairs.add((rec["key"], rec["type"] or "OTHER"))
        written.add(rec["key"])
        for short in rec["aliases"] or []:
            recorded[short] = rec["key"]
    for chunk in chunks:
        for key, entity in chunk_keys(chunk).items():
            known.setdefault(key, entity)
            pairs.add((key, entity.type))
    canonical = resolve_aliases(pairs, recorded)
    targets = {full: known[full] for full in canonical.values() if full in known}
    # a recorded alias whose full name no chunk mentions any more has nothing to point to
    canonical = {short: full for short, full in canonical.items() if full in targets}
    return DocumentAliases(canonical, targets), {key for key in written if key in canonical}


def _repoint(tx, document_id: str, short: str, full: str) -> set[str]:
    """Moves one document's mentions of `short`, and the relations its chunks state with it, to `full`; returns the
    entity keys that lost a relation or a mention."""
    chunk_ids = sorted(
        {rec["chunk_id"] for rec in tx.run(cypher.REPOINT_MENTIONS, document_id=document_id, short=short, full=full)}
    )
    if not chunk_ids:
        return set()
    moved, removed = [], []
    for query, outgoing in ((cypher.RELATIONS_OUT_OF, True), (cypher.RELATIONS_INTO, False)):
        for rec in list(tx.run(query, key=short, chunk_ids=chunk_ids)):
            source, target = (short, rec["other"]) if outgoing else (rec["other"], short)
            removed.append({"source": source, "target": target, "type": rec["type"], "chunk_ids": rec["chunk_ids"]})
            source, target = (full, rec["other"]) if outgoing else (rec["other"], full)
            if source != target:  # a relation between the short and the full form is no relation
                moved.append(
                    {"source": source, "target": target, "type": rec["type"], "chunk_ids": sorted(rec["chunk_ids"])}
                )
    touched = {short} | {row["source"] for row in removed} | {row["target"] for row in removed}
    if removed:
        tx.run(cypher.REMOVE_RELATION_CHUNKS, rows=removed).consume()
        tx.run(cypher.DELETE_EMPTY_RELATIONS, keys=sorted(touched)).consume()
    if moved:
        tx.run(cypher.MERGE_RELATIONS, rows=moved).consume()
    return touched


def _write_batch(tx, chunks: list[ChunkGraph]) -> _Batch:
    documents = _document_rows(chunks)
    tx.run(cypher.MERGE_DOCUMENTS, rows=documents).consume()
    written: dict[str, list[dict]] = {row["id"]: [] for row in documents}
    for rec in tx.run(
        cypher.DOCUMENT_ENTITIES, document_ids=list(written), rewritten=sorted(chunk.chunk_id for chunk in chunks)
    ):
        written[rec["document_id"]].append(rec.data())
    aliases: dict[str, DocumentAliases] = {}
    repoints: list[tuple[str, str, str]] = []
    for document_id, rows in written.items():
        aliases[document_id], moving = _document_aliases(
            rows, [chunk for chunk in chunks if chunk.document_id == document_id]
        )
        repoints.extend((document_id, short, aliases[document_id].canonical[short]) for short in sorted(moving))
    batch = _Batch.of(chunks, aliases)
    existing = [rec["id"] for rec in tx.run(cypher.EXISTING_CHUNKS, ids=batch.chunk_ids)]
    released: set[str] = set()
    if existing:
        existing_set = set(existing)
        released = _detach_chunks(tx, [row for row in batch.keep if row["chunk_id"] in existing_set])
    tx.run(cypher.MERGE_PAGES, rows=batch.pages).consume()
    tx.run(cypher.MERGE_CHUNKS, rows=batch.chunks).consume()
    if batch.entities:
        tx.run(cypher.MERGE_ENTITIES, rows=batch.entities).consume()
        tx.run(cypher.MERGE_MENTIONS, rows=batch.mentions).consume()
    if batch.relations:
        tx.run(cypher.MERGE_RELATIONS, rows=batch.relations).consume()
    for document_id, short, full in repoints:
        released |= _repoint(tx, document_id, short, full)
    if released:
        tx.run(cypher.DELETE_ORPHAN_ENTITIES, keys=sorted(released)).consume()
    return batch


def _delete_chunk_batch(tx, chunk_ids: list[str]) -> None:
    keep_nothing = [{"chunk_id": cid, "keep_keys": [], "keep_relations": []} for cid in chunk_ids]
    released = _detach_chunks(tx, keep_nothing)
    page_ids = [rec["page_id"] for rec in tx.run(cypher.DELETE_CHUNKS, ids=chunk_ids) if rec["page_id"] is not None]
    if released:
        tx.run(cypher.DELETE_ORPHAN_ENTITIES, keys=sorted(released)).consume()
    if page_ids:
        doc_ids = [
            rec["document_id"]
            for rec in tx.run(cypher.DELETE_EMPTY_PAGES, ids=sorted(set(page_ids)))
            if rec["document_id"] is not None
        ]
        if doc_ids:
            tx.run(cypher.DELETE_EMPTY_DOCUMENTS, ids=sorted(set(doc_ids))).consume()


# -- the store ---------------------------------------------------------------------------------------------------------
class GraphStore:
    def __init__(
        self,
        uri: str,
        user: str,
        password: str,
        database: str | None = None,
        *,
        batch_size: int = BATCH_SIZE,
        tx_timeout_s: float = TX_TIMEOUT_S,
        conflict_retries: int = CONFLICT_RETRIES,
    ):
        self.database = database or None
        self.batch_size = batch_size or BATCH_SIZE
        self.conflict_retries = conflict_retries
        timeout = tx_timeout_s or TX_TIMEOUT_S
        self._driver = neo4j.GraphDatabase.driver(
            uri, auth=(user, password), max_transaction_retry_time=timeout, connection_timeout=min(timeout, 15.0)
        )
        self._closed = False
        self._schema_ready = False

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _session(self):
        return self._driver.session(database=self.database)

    def _write(self, work, *args):
        """execute_write, plus a bounded retry on uniqueness conflicts.

        The managed transaction already retries transient errors.  A ConstraintError is not transient to the driver,
        but with MERGE-only writes keyed on the unique property it means a concurrent writer created the same node
        between our MATCH and CREATE (ArcadeDB is optimistic and reports it so; Neo4j locks and never does): running
        the transaction again finds the node and matches it.
        """
        for attempt in range(self.conflict_retries + 1):
            try:
                with self._session() as session:
                    return session.execute_write(work, *args)
            except neo4j.exceptions.ConstraintError:
                if attempt == self.conflict_retries:
                    raise
                time.sleep(random.uniform(0.02, 0.1) * (attempt + 1))
        raise AssertionError("unreachable")

    def _read(self, query: str, **params) -> list[dict]:
        with self._session() as session:
            return session.execute_read(lambda tx: [rec.data() for rec in tx.run(query, **params)])

    # -- schema --------------------------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Constraints and indexes (idempotent).  The uniqueness constraints are what make concurrent MERGEs safe."""
        # schema statements cannot share a transaction with each other on Neo4j: one each
        for statement in cypher.SCHEMA_STATEMENTS:
            with self._session() as session:
                session.execute_write(lambda tx, q=statement: tx.run(q).consume())
        self._schema_ready = True

    # -- writes --------------------------------------------------------------------------------------------------
    def write_chunks(self, chunks: list[ChunkGraph]) -> tuple[int, int]:
        """Write (or rewrite) these chunks; returns the distinct (entities, relationships) they state."""
        if not self._schema_ready:
            self.ensure_schema()
        unique = last_write_wins(chunks)
        entity_keys: set[str] = set()
        relations: set[tuple[str, str, str]] = set()
        for part in _batches(unique, self.batch_size):
            batch = self._write(_write_batch, part)
            entity_keys.update(row["key"] for row in batch.entities)
            relations.update((r["source"], r["target"], r["type"]) for r in batch.relations)
        return len(entity_keys), len(relations)

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        ids = sorted(set(chunk_ids))
        for part in _batches(ids, self.batch_size):
            self._write(_delete_chunk_batch, part)

    def delete_document(self, document_id: str) -> None:
        self.delete_chunks(self.chunk_ids_with_writes(document_id))
        # pages or a document left without chunks (e.g. an interrupted earlier delete)
        self._write(lambda tx: tx.run("MATCH (p:Page {document_id: $id}) DETACH DELETE p", id=document_id).consume())
        self._write(lambda tx: tx.run("MATCH (d:Document {id: $id}) DETACH DELETE d", id=document_id).consume())

    # -- reads ---------------------------------------------------------------------------------------------------
    def chunk_ids_with_writes(self, document_id: str | None = None) -> set[str]:
        if document_id is None:
            rows = self._read("MATCH (c:Chunk) RETURN c.id AS id")
        else:
            rows = self._read("MATCH (c:Chunk {document_id: $doc}) RETURN c.id AS id", doc=document_id)
        return {row["id"] for row in rows}

    def chunk_id_pages(self, page_size: int) -> Iterator[list[str]]:
        """Every Chunk node's id in id order, in pages of at most `page_size` (`_chunk_pages`)."""
        for page in self._chunk_pages(page_size, ""):
            yield [chunk_id for chunk_id, _ in page]

    def chunk_mention_pages(self, page_size: int) -> Iterator[list[tuple[str, int]]]:
        """(id, mention weight) of every Chunk node in id order: `chunk_id_pages`'s walk counting MENTIONS edges, each
        as its target plus its `aliases` (orchestration/verify.py says why it is at least `entities_extracted`)."""
        # not OPTIONAL MATCH, which the embedded server answers by walking MENTIONS edges beyond the range's chunks
        # (1.0 s a range of 1,000 ids at a million chunks: quadratic over the walk; this form 0.05 s, same weights)
        weight = "reduce(w = 0, m IN [(c)-[r:MENTIONS]->() | r] | w + 1 + size(coalesce(m.aliases, [])))"
        yield from self._chunk_pages(page_size, f" RETURN c.id AS id, {weight} AS n")

    def _chunk_pages(self, page_size: int, returning: str) -> Iterator[list[tuple[str, int]]]:
        """(id, what `returning` reads or 0) of every Chunk node in id order, one bounded range of ids a query:
        verification reads the graph once, in bounded memory, not a lookup per queue row (0.8 ms each at a million).

        Not `id > $after ORDER BY id LIMIT n`: the embedded server answers that by reading every id above $after,
        3.5 s a page at the start of a million ids (quadratic over the walk), while a range between two bounds is
        read from the chunk_id constraint's index (2-20 ms for a few hundred ids). The bounds cut the space of the
        ids' 32 hex digits (queue_db.keys.chunk_id) and each range's width follows the last one's count; together
        they cover every string, so an id of any other form still falls into exactly one range."""
        tail, position, width, lower = returning or " RETURN c.id AS id", 0, _ID_SPACE // 1024, ""
        while True:
            position += width
            upper = f"{position:032x}" if position < _ID_SPACE else None
            bounded = "" if upper is None else " AND c.id < $upper"
            rows = self._read(f"MATCH (c:Chunk) WHERE c.id >= $lower{bounded}{tail}", lower=lower, upper=upper)
            found = sorted((row["id"], int(row.get("n") or 0)) for row in rows)
            for start in range(0, len(found), page_size):
                yield found[start : start + page_size]
            if upper is None:
                return
            lower = upper
            # about page_size ids a range: grow fast through a sparse graph, shrink after a crowded range
            width = max(1, int(width * min(16.0, max(0.25, page_size / max(len(found), 1)))))

    def duplicate_entities(self) -> list[str]:
        rows = self._read(
            "MATCH (e:Entity) WITH e.key AS entity_key, count(*) AS n WHERE n > 1 RETURN entity_key ORDER BY entity_key"
        )
        return [row["entity_key"] for row in rows]

    def entity(self, name: str, limit: int = 100, tenant: str = BASE_TENANT) -> dict | None:
        """The entity of that exact (normalised) name, else the one a document resolved that name to ("Lessig" in a
        book that names "Lawrence Lessig"); the most mentioned one when several documents resolved it differently.
        Only `tenant`'s: its entity keys are its own, so its mentions and relations are too."""
        key = tenant_entity_key(tenant, normalize_entity_name(name))
        found = self._read("MATCH (e:Entity {key: $key}) RETURN e.name AS name, e.type AS type, e.key AS key", key=key)
        if not found:
            found = self._read(
                "MATCH (:Chunk)-[m:MENTIONS]->(e:Entity) WHERE $key IN m.aliases "
                "RETURN e.name AS name, e.type AS type, e.key AS key, count(m) AS n ORDER BY n DESC, key LIMIT 1",
                key=key,
            )
            if not found:
                return None
            found = [{field: found[0][field] for field in ("name", "type", "key")}]
            key = found[0]["key"]
        aliases = self._read(
            "MATCH (:Entity {key: $key})<-[m:MENTIONS]-(:Chunk) WHERE m.aliases IS NOT NULL "
            "UNWIND m.aliases AS alias RETURN DISTINCT alias ORDER BY alias",
            key=key,
        )
        mentions = self._read(
            "MATCH (e:Entity {key: $key})<-[:MENTIONS]-(c:Chunk)<-[:HAS_CHUNK]-(:Page)<-[:HAS_PAGE]-(d:Document) "
            "RETURN DISTINCT d.id AS document_id, d.filename AS filename, c.page_number AS page_number "
            "ORDER BY document_id, page_number LIMIT $limit",
            key=key,
            limit=limit,
        )
        outgoing = self._read(
            "MATCH (e:Entity {key: $key})-[r:RELATED_TO]->(o:Entity) "
            "RETURN o.name AS name, o.type AS type, r.type AS rel_type, r.weight AS weight "
            "ORDER BY weight DESC, name LIMIT $limit",
            key=key,
            limit=limit,
        )
        incoming = self._read(
            "MATCH (e:Entity {key: $key})<-[r:RELATED_TO]-(o:Entity) "
            "RETURN o.name AS name, o.type AS type, r.type AS rel_type, r.weight AS weight "
            "ORDER BY weight DESC, name LIMIT $limit",
            key=key,
            limit=limit,
        )
        related = [{**row, "direction": "out"} for row in outgoing] + [{**row, "direction": "in"} for row in incoming]
        related.sort(key=lambda row: (-(row["weight"] or 0), row["name"] or ""))
        return {
            **found[0],
            "aliases": [bare_entity_key(row["alias"]) for row in aliases],
            "mentions": mentions,
            "related": related[:limit],
        }

    def chunk_entities(
        self, chunk_ids: Sequence[str], per_chunk: int, related_per_chunk: int = 0, tenant: str = BASE_TENANT
    ) -> dict[str, ChunkEntities]:
        """The entities of search hits' chunks (resources/ports.GraphStore.chunk_entities). Each read is one
        auto-commit query, one round trip without retries: a person waits on it, so a graph that does not answer
        costs one attempt and is said as GraphStoreUnavailable."""
        ids = sorted(set(chunk_ids))
        if not ids or per_chunk <= 0:
            return {}
        shown = {
            row["chunk_id"]: row
            for row in self._read_once(
                cypher.CHUNK_ENTITIES, chunk_ids=ids, limit=per_chunk, tenant=tenant, base_tenant=BASE_TENANT
            )
        }
        related: dict[str, list[RelatedEntity]] = {}
        if related_per_chunk > 0 and shown:
            keys = [{"chunk_id": cid, "keys": row["keys"]} for cid, row in shown.items()]
            for row in self._read_once(cypher.RELATED_ENTITIES, rows=keys, limit=related_per_chunk):
                related[row["chunk_id"]] = [RelatedEntity(**r) for r in row["related"]]
        return {
            cid: ChunkEntities([MentionedEntity(**e) for e in row["entities"]], row["total"], related.get(cid, []))
            for cid, row in shown.items()
        }

    def _read_once(self, query: str, **params) -> list[dict]:
        try:
            with self._session() as session:
                return [rec.data() for rec in session.run(query, **params)]
        except (neo4j.exceptions.DriverError, neo4j.exceptions.Neo4jError, OSError) as exc:
            raise GraphStoreUnavailable(f"the graph server did not answer ({type(exc).__name__})") from exc

    def counts(self) -> dict:
        queries = {
            "documents": "MATCH (n:Document) RETURN count(n) AS n",
            "pages": "MATCH (n:Page) RETURN count(n) AS n",
            "chunks": "MATCH (n:Chunk) RETURN count(n) AS n",
            "entities": "MATCH (n:Entity) RETURN count(n) AS n",
            "relationships": "MATCH (:Entity)-[r:RELATED_TO]->(:Entity) RETURN count(r) AS n",
        }
        return {name: self._read(query)[0]["n"] for name, query in queries.items()}

    def ping(self) -> None:
        """Raise the driver's error unless the server accepts our credentials."""
        self._driver.verify_connectivity()

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._driver.close()

    def __enter__(self) -> "GraphStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
