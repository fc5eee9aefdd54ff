-- How many keys each registration block holds, so that the runners of `docqueue run --workers N` split one block
-- between them (each a contiguous share of its positions) instead of each block going whole to one runner: one
-- `docqueue ingest` of many files is one block, and so are the pages of the documents one planning round split.
-- A block registered before this table has no row and still goes whole to one runner.
CREATE TABLE IF NOT EXISTS partition_blocks (
    block bigint PRIMARY KEY,
    size integer NOT NULL CHECK (size > 0)
);
