-- Versions: ingesting a known source path with new content registers a new document that supersedes the old
-- one; the old version is removed once the new one is fully indexed.
ALTER TABLE documents
ADD COLUMN IF NOT EXISTS supersedes UUID REFERENCES documents(id) ON DELETE SET NULL;
CREATE INDEX IF NOT EXISTS idx_documents_supersedes ON documents(supersedes) WHERE supersedes IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_documents_source_path ON documents(source_path);
