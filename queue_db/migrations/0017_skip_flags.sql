-- Phases skipped on purpose, so they are told apart from phases done (seed: extractionSkipped, embeddingSkipped):
-- a document re-embedded without its text being extracted again (docqueue reindex), and a page that had no text
-- to embed (no chunks: its vector and GraphRAG phases complete with nothing to do).
ALTER TABLE documents ADD COLUMN IF NOT EXISTS extraction_skipped BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE task_queue_page ADD COLUMN IF NOT EXISTS embedding_skipped BOOLEAN NOT NULL DEFAULT false;
