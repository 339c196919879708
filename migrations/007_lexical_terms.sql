-- Deskmate schema, version 7: the words of each memory, for hybrid lexical + embedding scoring
-- (issue 5, BENCHMARKS.md). A trigger keeps them right however a memory is written (saves, edits,
-- imports, restores) without the application computing anything. It fires only when the text is
-- written: the per-reply counter updates (thousands of rows on a first reply of the day) do not
-- pay for it, as they would for a generated column.
-- 'english' stems ("painted", "painting" -> "paint") and drops English stop words; other languages
-- are kept word by word, and the per-reply weighting (rare words count most) discounts their
-- common words.
ALTER TABLE memories ADD COLUMN terms tsvector;

CREATE FUNCTION memories_set_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.terms := to_tsvector('english'::regconfig, NEW.text);
    RETURN NEW;
END
$$;

CREATE TRIGGER memories_terms BEFORE INSERT OR UPDATE OF text ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_set_terms();

UPDATE memories SET terms = to_tsvector('english'::regconfig, text);
