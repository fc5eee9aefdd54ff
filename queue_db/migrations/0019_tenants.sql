-- Tenants (queue_db/tenants.py): every document belongs to one project. Documents registered before this
-- migration belong to `default`, whose keys are unchanged. Adding a column with a constant default rewrites no
-- row; the CHECK reads the table once.
ALTER TABLE documents ADD COLUMN IF NOT EXISTS tenant_id TEXT NOT NULL DEFAULT 'default';
DO $$ BEGIN
    ALTER TABLE documents ADD CONSTRAINT documents_tenant_id_shape CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Content-hash deduplication and idempotency keys hold per tenant: the same file in two tenants is two documents.
-- Both global indexes are docqueue's own (0002, 0013), not the seed's, so the per-tenant ones replace them.
CREATE UNIQUE INDEX IF NOT EXISTS uq_documents_content_hash_tenant ON documents (content_hash, tenant_id)
    WHERE content_hash IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS uq_documents_idempotency_key_tenant ON documents (idempotency_key, tenant_id);
DROP INDEX IF EXISTS uq_documents_content_hash;
DROP INDEX IF EXISTS uq_documents_idempotency_key;

-- `docqueue status --tenant T` pages through one tenant in registration order, and `docqueue delete --tenant T`
-- takes its documents a batch at a time: both read this index.
CREATE INDEX IF NOT EXISTS idx_documents_tenant_listing ON documents (tenant_id, created_at, id);
