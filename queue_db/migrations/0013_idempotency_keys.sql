-- A caller-chosen idempotency key per document: registering twice with the same key is one document, and the same
-- key with other bytes is refused (queue.register_document). Nullable, so documents registered without a key
-- (everything before this migration) are untouched; a unique index treats NULLs as distinct, so any number of
-- keyless documents coexist. VARCHAR(255) bounds what a caller can store.
ALTER TABLE documents ADD COLUMN IF NOT EXISTS idempotency_key VARCHAR(255);
CREATE UNIQUE INDEX IF NOT EXISTS uq_documents_idempotency_key ON documents(idempotency_key);
