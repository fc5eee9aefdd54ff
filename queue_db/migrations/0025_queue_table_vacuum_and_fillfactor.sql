-- The queue tables take an update per transition (claim, heartbeat, completion, bubble-up), so they gather dead
-- row versions faster than the defaults expect: autovacuum waits for 20 % of a table to be dead and then works
-- throttled. On these tables it starts at 2 % (a million-chunk table: 20,000 dead versions instead of 200,000),
-- runs unthrottled, and analyzes as often, so the claim index's plans follow the statuses as they move.
-- Free space left in each page (fillfactor) lets an update put its new version beside the old one: a HOT
-- update when no indexed column changes (a page's or document's roll-up counters), and fewer pages touched
-- otherwise. It applies to pages written from now on; VACUUM FULL or pg_repack rewrites older ones.
ALTER TABLE task_queue_chunk SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE task_queue_page SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE documents SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 200,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
