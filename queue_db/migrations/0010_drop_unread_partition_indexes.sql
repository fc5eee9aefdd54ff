-- No query reads task_queue_page or task_queue_chunk by (partition_block, partition_pos): the Dagster bridge
-- (queue_db/partitions.py) finds rows by claim order, by partition key (document key, page number, chunk index)
-- or through idx_*_unregistered, and only carries block and position along. Every non-HOT update of a task row
-- (two per task and phase: the claim and the completion) still inserted an entry into these full indexes: measured
-- on the vector phase, 4 workers x batch 50, they were about a tenth of the WAL written per task.
DROP INDEX IF EXISTS idx_tqp_partition;
DROP INDEX IF EXISTS idx_tqc_partition;
