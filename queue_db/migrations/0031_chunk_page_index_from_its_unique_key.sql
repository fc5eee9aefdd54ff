-- A chunk's page is looked up through the unique key (page_id, chunk_index), whose index leads with page_id and
-- answers every lookup by page (the bubble-up's recount, the cascade from a page, a page's chunks in order) as
-- idx_tqc_page did. idx_tqc_page itself is only a cost: the claim and the completion of a chunk each change its
-- status, which no update can do in place (HOT) while partial indexes test it, so each added an entry to it.
DROP INDEX IF EXISTS idx_tqc_page;
