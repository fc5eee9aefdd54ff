-- Near-duplicate documents (issue 27). After a document's OCR completes, its MinHash signature over word shingles
-- (processing/near_duplicates.py) is kept here, cut into LSH bands. Candidates are the documents sharing a band's
-- hash: one probe of the band table's primary key per band, so finding them costs per document, never a scan of
-- the corpus. A document whose estimated Jaccard similarity to its best candidate reaches
-- DOCQUEUE_NEAR_DUP_THRESHOLD joins that candidate's content group (queue_db/near_duplicates.py).
CREATE TABLE IF NOT EXISTS document_signatures (
    document_id uuid PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
    minhash integer[] NOT NULL,
    shingles integer NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS document_signature_bands (
    band smallint NOT NULL,
    hash bigint NOT NULL,
    document_id uuid NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    PRIMARY KEY (band, hash, document_id)
);
-- deleting a document removes its bands through this index
CREATE INDEX IF NOT EXISTS idx_signature_bands_document ON document_signature_bands (document_id);

-- A content group is about content, whatever the source path: a new version of a file keeps its `supersedes`
-- link and may sit in a group as well. Groups stay within a tenant. The representative is the group's earliest
-- registered member.
CREATE TABLE IF NOT EXISTS content_groups (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id text NOT NULL,
    representative_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idx_content_groups_tenant ON content_groups (tenant_id);
-- similarity: the estimated Jaccard similarity to the member it was matched with when it joined
CREATE TABLE IF NOT EXISTS content_group_members (
    document_id uuid PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
    group_id uuid NOT NULL REFERENCES content_groups(id) ON DELETE CASCADE,
    similarity real NOT NULL,
    matched_document_id uuid,
    joined_at timestamptz NOT NULL DEFAULT now()
);
-- a group's members in the order they joined: search lists the first few of a large group without reading it all
CREATE INDEX IF NOT EXISTS idx_content_group_members_group ON content_group_members (group_id, joined_at, document_id);

-- However a document goes (`docqueue delete`, a tenant's deletion, an old version retired), its group stays
-- consistent: a group left with one member is no group, and a group whose representative went gets its earliest
-- remaining member. A trigger, so that every way of deleting a document keeps the rule.
CREATE OR REPLACE FUNCTION docqueue_content_group_left() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    remaining integer;
BEGIN
    SELECT count(*) INTO remaining
    FROM (SELECT 1 FROM content_group_members WHERE group_id = OLD.group_id LIMIT 2) m;
    IF remaining < 2 THEN
        DELETE FROM content_groups WHERE id = OLD.group_id;
    ELSE
        UPDATE content_groups g SET representative_id = (
            SELECT m.document_id FROM content_group_members m JOIN documents d ON d.id = m.document_id
            WHERE m.group_id = OLD.group_id ORDER BY d.created_at, d.id LIMIT 1)
        WHERE g.id = OLD.group_id AND g.representative_id = OLD.document_id;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS content_group_member_left ON content_group_members;
CREATE TRIGGER content_group_member_left AFTER DELETE ON content_group_members
    FOR EACH ROW EXECUTE FUNCTION docqueue_content_group_left();
