-- A document's signature records the format it was computed in (processing/near_duplicates.FORMAT). Signatures of
-- different formats estimate nothing about each other (other shingles, other hashes), so candidates are compared
-- only within one format; the signatures written before this column existed are format 1 (four-word shingles) and
-- stay out of every new comparison until `docqueue regroup` signs their documents again from the stored page texts.
ALTER TABLE document_signatures ADD COLUMN IF NOT EXISTS format smallint NOT NULL DEFAULT 1;
-- `docqueue regroup` finds the documents signed in an older format without reading every signature
CREATE INDEX IF NOT EXISTS idx_document_signatures_format ON document_signatures (format, document_id);
