"""The Cypher the graph adapter (resources/bolt_graph.py) runs: portable, the same statements against Neo4j 5 and
ArcadeDB's Bolt plugin. Every write is a MERGE batched with UNWIND, so writing the same rows again changes nothing."""

SCHEMA_STATEMENTS = (
    "CREATE CONSTRAINT document_id IF NOT EXISTS FOR (d:Document) REQUIRE d.id IS UNIQUE",
    "CREATE CONSTRAINT page_id IF NOT EXISTS FOR (p:Page) REQUIRE p.id IS UNIQUE",
    "CREATE CONSTRAINT chunk_id IF NOT EXISTS FOR (c:Chunk) REQUIRE c.id IS UNIQUE",
    "CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE",
    "CREATE INDEX chunk_document IF NOT EXISTS FOR (c:Chunk) ON (c.document_id)",
    "CREATE INDEX page_document IF NOT EXISTS FOR (p:Page) ON (p.document_id)",
)

EXISTING_CHUNKS = "MATCH (c:Chunk) WHERE c.id IN $ids RETURN c.id AS id"

# Taken first in every write: the counter write locks each Document node (Neo4j) or makes concurrent transactions on
# one document conflict and retry (ArcadeDB), so writers of one document run one after the other and each resolves
# its short forms against everything the others wrote.
MERGE_DOCUMENTS = """
UNWIND $rows AS row
MERGE (d:Document {id: row.id})
SET d.filename = row.filename, d.tenant_id = row.tenant_id, d.writes = coalesce(d.writes, 0) + 1
"""

# bounded by the documents: the entities their other chunks mention and the short forms they used for them
DOCUMENT_ENTITIES = """
UNWIND $document_ids AS document_id
MATCH (c:Chunk {document_id: document_id})-[m:MENTIONS]->(e:Entity)
WHERE NOT c.id IN $rewritten
RETURN DISTINCT document_id, e.key AS key, e.name AS name, e.type AS type, m.aliases AS aliases
"""

# one short form's mentions within one document move to the full name's node, keeping the short key as an alias
REPOINT_MENTIONS = """
MATCH (c:Chunk {document_id: $document_id})-[m:MENTIONS]->(:Entity {key: $short})
MATCH (f:Entity {key: $full})
MERGE (c)-[n:MENTIONS]->(f)
SET n.aliases = coalesce(n.aliases, [])
    + [a IN coalesce(m.aliases, []) + [$short] WHERE NOT a IN coalesce(n.aliases, [])]
DELETE m
RETURN c.id AS chunk_id
"""

RELATIONS_OUT_OF = """
MATCH (:Entity {key: $key})-[r:RELATED_TO]->(o:Entity)
WHERE any(cid IN r.chunk_ids WHERE cid IN $chunk_ids)
RETURN o.key AS other, r.type AS type, [cid IN r.chunk_ids WHERE cid IN $chunk_ids] AS chunk_ids
"""

RELATIONS_INTO = """
MATCH (o:Entity)-[r:RELATED_TO]->(:Entity {key: $key})
WHERE any(cid IN r.chunk_ids WHERE cid IN $chunk_ids)
RETURN o.key AS other, r.type AS type, [cid IN r.chunk_ids WHERE cid IN $chunk_ids] AS chunk_ids
"""

REMOVE_RELATION_CHUNKS = """
UNWIND $rows AS row
MATCH (:Entity {key: row.source})-[r:RELATED_TO {type: row.type}]->(:Entity {key: row.target})
SET r.chunk_ids = [cid IN r.chunk_ids WHERE NOT cid IN row.chunk_ids]
SET r.weight = size(r.chunk_ids)
"""

MERGE_PAGES = """
UNWIND $rows AS row
MATCH (d:Document {id: row.document_id})
MERGE (p:Page {id: row.id})
SET p.document_id = row.document_id, p.number = row.number, p.tenant_id = row.tenant_id
MERGE (d)-[:HAS_PAGE]->(p)
"""

MERGE_CHUNKS = """
UNWIND $rows AS row
MATCH (p:Page {id: row.page_id})
MERGE (c:Chunk {id: row.id})
SET c.document_id = row.document_id, c.page_number = row.page_number, c.`index` = row.`index`,
    c.tenant_id = row.tenant_id
MERGE (p)-[:HAS_CHUNK]->(c)
"""

MERGE_ENTITIES = """
UNWIND $rows AS row
MERGE (e:Entity {key: row.key})
ON CREATE SET e.name = row.name, e.type = row.type, e.tenant_id = row.tenant_id
"""

MERGE_MENTIONS = """
UNWIND $rows AS row
MATCH (c:Chunk {id: row.chunk_id})
MATCH (e:Entity {key: row.key})
MERGE (c)-[m:MENTIONS]->(e)
SET m.aliases = row.aliases, m.tenant_id = row.tenant_id
"""

# chunk_ids is a set: append only the ids not already present; weight follows from it
MERGE_RELATIONS = """
UNWIND $rows AS row
MATCH (a:Entity {key: row.source})
MATCH (b:Entity {key: row.target})
MERGE (a)-[r:RELATED_TO {type: row.type}]->(b)
ON CREATE SET r.chunk_ids = []
SET r.chunk_ids = r.chunk_ids + [cid IN row.chunk_ids WHERE NOT cid IN r.chunk_ids]
SET r.weight = size(r.chunk_ids)
"""

# A relation's source is always mentioned by the chunk that states it, so the chunk's mentions anchor the search.
DETACH_RELATIONS = """
UNWIND $rows AS row
MATCH (c:Chunk {id: row.chunk_id})-[:MENTIONS]->(a:Entity)-[r:RELATED_TO]->(b:Entity)
WHERE row.chunk_id IN r.chunk_ids AND NOT (a.key + $sep + b.key + $sep + r.type) IN row.keep
SET r.chunk_ids = [cid IN r.chunk_ids WHERE cid <> row.chunk_id]
SET r.weight = size(r.chunk_ids)
RETURN DISTINCT a.key AS entity_key
"""

DELETE_EMPTY_RELATIONS = """
UNWIND $keys AS k
MATCH (:Entity {key: k})-[r:RELATED_TO]->(:Entity)
WHERE size(r.chunk_ids) = 0
DELETE r
"""

DETACH_MENTIONS = """
UNWIND $rows AS row
MATCH (c:Chunk {id: row.chunk_id})-[m:MENTIONS]->(e:Entity)
WHERE NOT e.key IN row.keep
DELETE m
RETURN DISTINCT e.key AS entity_key
"""

DELETE_ORPHAN_ENTITIES = """
UNWIND $keys AS k
MATCH (e:Entity {key: k})
WHERE NOT EXISTS { (e)<-[:MENTIONS]-(:Chunk) }
DETACH DELETE e
"""

# A chunk's page and a page's document are read with pattern comprehensions, not OPTIONAL MATCH: the embedded
# server answers OPTIONAL MATCH (p:Page)-[:HAS_CHUNK]->(c) by walking HAS_CHUNK edges beyond the chunks asked for
# (1.1-2.1 s for 8 chunks at a million, 0.02-0.05 s this way)
DELETE_CHUNKS = """
MATCH (c:Chunk) WHERE c.id IN $ids
WITH c, [(p:Page)-[:HAS_CHUNK]->(c) | p.id] AS pages
DETACH DELETE c
WITH pages UNWIND pages AS page_id
RETURN DISTINCT page_id
"""

DELETE_EMPTY_PAGES = """
UNWIND $ids AS pid
MATCH (p:Page {id: pid})
WHERE NOT EXISTS { (p)-[:HAS_CHUNK]->(:Chunk) }
WITH p, [(d:Document)-[:HAS_PAGE]->(p) | d.id] AS documents
DETACH DELETE p
WITH documents UNWIND documents AS document_id
RETURN DISTINCT document_id
"""

DELETE_EMPTY_DOCUMENTS = """
UNWIND $ids AS did
MATCH (d:Document {id: did})
WHERE NOT EXISTS { (d)-[:HAS_PAGE]->(:Page) }
DETACH DELETE d
"""

# Search hits' entities: each chunk found through the chunk_id constraint's index, its mentions by name, cut to the
# bound after counting them. A chunk of another tenant is left out (chunks from before tenants are `default`'s).
CHUNK_ENTITIES = """
UNWIND $chunk_ids AS chunk_id
MATCH (c:Chunk {id: chunk_id})-[:MENTIONS]->(e:Entity)
WHERE coalesce(c.tenant_id, $base_tenant) = $tenant
WITH chunk_id, e ORDER BY e.name, e.key
WITH chunk_id, collect(e.key) AS keys,
     collect({name: coalesce(e.name, e.key), type: coalesce(e.type, 'OTHER')}) AS entities
RETURN chunk_id, keys[..$limit] AS keys, entities[..$limit] AS entities, size(entities) AS total
"""

# The strongest relations of the entities a hit shows (each found through the entity_key constraint's index) to
# entities it does not show. Entity keys carry the tenant, so the walk stays within the chunk's tenant.
RELATED_ENTITIES = """
UNWIND $rows AS row
UNWIND row.keys AS key
MATCH (e:Entity {key: key})-[r:RELATED_TO]-(o:Entity)
WHERE NOT o.key IN row.keys
WITH row.chunk_id AS chunk_id, e, r, o, CASE WHEN startNode(r) = e THEN 'out' ELSE 'in' END AS direction
ORDER BY r.weight DESC, o.name, e.name, r.type
WITH chunk_id, collect({entity: coalesce(e.name, e.key), name: coalesce(o.name, o.key),
                        type: coalesce(o.type, 'OTHER'), relation: r.type, weight: coalesce(r.weight, 0),
                        direction: direction}) AS related
RETURN chunk_id, related[..$limit] AS related
"""
