-- A task's status index serves the reads of its failed rows (the earliest retry, the rows backing off, an
-- operator's retry); pending rows are found through the claim index. Holding pending rows too made it a cost of
-- every other phase's transitions: a chunk's vector claim and completion each added an entry to the graph phase's
-- status index while that phase waited (an update that changes a status is never HOT), and a page's OCR
-- transitions to the vector and graph phases' indexes. It now holds failed rows only.
DROP INDEX IF EXISTS idx_tqp_ocr_status;
CREATE INDEX idx_tqp_ocr_status ON task_queue_page (ocr_status) WHERE ocr_status = 'failed';
DROP INDEX IF EXISTS idx_tqp_vector_status;
CREATE INDEX idx_tqp_vector_status ON task_queue_page (vector_status) WHERE vector_status = 'failed';
DROP INDEX IF EXISTS idx_tqp_graphrag_status;
CREATE INDEX idx_tqp_graphrag_status ON task_queue_page (graphrag_status) WHERE graphrag_status = 'failed';
DROP INDEX IF EXISTS idx_tqc_vector_status;
CREATE INDEX idx_tqc_vector_status ON task_queue_chunk (vector_status) WHERE vector_status = 'failed';
DROP INDEX IF EXISTS idx_tqc_graphrag_status;
CREATE INDEX idx_tqc_graphrag_status ON task_queue_chunk (graphrag_status) WHERE graphrag_status = 'failed';
