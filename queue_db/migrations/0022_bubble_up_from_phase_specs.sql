-- The bubble-up is generated from the phase specs (queue_db/phases.py, queue_db/rollup_sql.py) and sent as
-- prepared statements in the transition's own pipelined transaction, so a phase is added by adding its spec: the
-- functions that named every phase in their branches go. docqueue_status_rule and the docqueue_rollup aggregate
-- stay, the rule itself, which names no phase.
DROP FUNCTION IF EXISTS docqueue_bubble_after(text, text, uuid[]);
DROP FUNCTION IF EXISTS docqueue_bubble_documents(text, uuid[], uuid[]);
DROP FUNCTION IF EXISTS docqueue_bubble_pages(text, uuid[], uuid[]);
DROP FUNCTION IF EXISTS docqueue_transition(text, text, jsonb);
DROP FUNCTION IF EXISTS docqueue_bubble(text, uuid[], uuid[]);
