-- Deskmate schema, version 10: the words of chat-history chunks and document passages, so a reply
-- whose message could not be embedded still finds them by text (the text fallback; memories have
-- theirs since version 7). As there, a trigger keeps them right however a row is written, and only
-- when its text is: chunks never change, passages are replaced whole.
-- 'english' stems and drops English stop words, the same configuration as memories.terms, so one
-- message's words match all three the same way. A passage's section (its heading path) counts too:
-- "Minecraft" names what a passage under that heading is about.
ALTER TABLE history_chunks ADD COLUMN terms tsvector;
ALTER TABLE document_passages ADD COLUMN terms tsvector;

CREATE FUNCTION history_chunks_set_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.terms := to_tsvector('english'::regconfig, NEW.text);
    RETURN NEW;
END
$$;

CREATE TRIGGER history_chunks_terms BEFORE INSERT OR UPDATE OF text ON history_chunks
    FOR EACH ROW EXECUTE FUNCTION history_chunks_set_terms();

CREATE FUNCTION document_passages_set_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.terms := to_tsvector('english'::regconfig, NEW.section || ' ' || NEW.text);
    RETURN NEW;
END
$$;

CREATE TRIGGER document_passages_terms BEFORE INSERT OR UPDATE OF section, text ON document_passages
    FOR EACH ROW EXECUTE FUNCTION document_passages_set_terms();

UPDATE history_chunks SET terms = to_tsvector('english'::regconfig, text);
UPDATE document_passages SET terms = to_tsvector('english'::regconfig, section || ' ' || text);

-- A channel's chunks and a server's passages are found through their own indexes first (the text
-- search filters by channel or server, as the vector search does); these serve a large channel or
-- library, where the words narrow it down faster.
CREATE INDEX history_chunks_terms ON history_chunks USING gin (terms);
CREATE INDEX document_passages_terms ON document_passages USING gin (terms);
