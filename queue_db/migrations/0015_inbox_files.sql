-- Every file the inbox sensor has read, with the size and modification time it had then: a tick hashes only files
-- that are new or changed since, so an edit that keeps the size is seen and a duplicate at a second path is not
-- hashed again on every tick.
CREATE TABLE IF NOT EXISTS inbox_files (
    source_path TEXT PRIMARY KEY,
    size_bytes BIGINT NOT NULL,
    mtime_ns BIGINT NOT NULL,
    document_id UUID REFERENCES documents(id) ON DELETE SET NULL,
    outcome VARCHAR(20) NOT NULL,
    seen_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
);
