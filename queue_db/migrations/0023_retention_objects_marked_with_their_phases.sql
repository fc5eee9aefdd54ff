-- Partition retention's index and trigger per level name every phase of the level's rows. They are generated from
-- the phase specs (queue_db.rollup_sql.retention_ddl), which marks each with the phases it was made for, as its
-- comment: `docqueue db upgrade` rebuilds one only when the phases changed. The three phases' objects, made by
-- migration 0020, get the marks they already fit.
COMMENT ON INDEX idx_tqp_retirable IS 'phases: ocr,vector,graphrag';
COMMENT ON INDEX idx_tqc_retirable IS 'phases: vector,graphrag';
COMMENT ON TRIGGER trg_tqp_unretire ON task_queue_page IS 'phases: ocr,vector,graphrag';
COMMENT ON TRIGGER trg_tqc_unretire ON task_queue_chunk IS 'phases: vector,graphrag';
