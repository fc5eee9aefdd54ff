-- A chunk's text moves off its queue row into task_queue_chunk_text, written once when the page is chunked.
-- Every claim and every completion writes a whole new version of the queue row (PostgreSQL's MVCC), and chunk text
-- (about 1 KB for a 256-token chunk) stayed inline, below the 2 KB at which PostgreSQL moves values out of line,
-- so each of those writes copied the text again into the heap and the WAL: measured at 4 workers x batch 50 with
-- 1,200-character chunks, 5.9 KB of WAL per task, 2.5 times the same queue with short texts. The claim reads the
-- text back by primary key. `content` was docqueue's own column (not the seed's), so it is dropped here.
CREATE TABLE IF NOT EXISTS task_queue_chunk_text (
    chunk_task_id UUID PRIMARY KEY REFERENCES task_queue_chunk(id) ON DELETE CASCADE,
    content TEXT NOT NULL
);

INSERT INTO task_queue_chunk_text (chunk_task_id, content)
SELECT id, content FROM task_queue_chunk WHERE content IS NOT NULL
ON CONFLICT (chunk_task_id) DO NOTHING;

ALTER TABLE task_queue_chunk DROP COLUMN IF EXISTS content;
