-- What a run of each task kind costs, as its runs measure it: the seconds of work a partition key takes and the
-- seconds a run spends before its work starts (launch, plan, resources, the executor's hand-over). The planners
-- size runs from it so that the fixed part stays a small share of a run (orchestration.planning). One row per
-- kind, updated in place as a moving average: its size never grows with the corpus.
CREATE TABLE IF NOT EXISTS run_costs (
    kind character varying(64) PRIMARY KEY,
    key_seconds double precision NOT NULL CHECK (key_seconds >= 0),
    overhead_seconds double precision NOT NULL CHECK (overhead_seconds >= 0),
    runs bigint NOT NULL DEFAULT 1,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
