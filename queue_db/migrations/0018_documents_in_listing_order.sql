-- `docqueue status` lists documents a page at a time in registration order: the index makes each page cost the
-- same however many documents there are.
CREATE INDEX IF NOT EXISTS idx_documents_listing ON documents (created_at, id);
