-- Deskmate schema, version 11: nothing is lost by a change. Every change of a memory's text (the model's
-- update, a day-end correction, a command edit, a restore, a merge) first keeps the text it replaces as a
-- version, in the same transaction as the change. A version says what the text was, who wrote it and when
-- (`written_by`, `written_at`, `source`), and who replaced it, how, when and why (`replaced_by`,
-- `replaced_via`, `replaced_at`, `reason`). Versions go with their memory (ON DELETE CASCADE);
-- delete-my-data removes the versions a person wrote and the name of the person who replaced one.
CREATE TABLE memory_versions (
    id            bigserial PRIMARY KEY,
    memory_id     bigint NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    text          text NOT NULL CHECK (length(text) BETWEEN 1 AND 4000),
    tags          text[] NOT NULL DEFAULT '{}',
    source        text NOT NULL CHECK (source IN ('bot', 'command', 'import', 'notes')),
    written_by    bigint,
    written_at    timestamptz NOT NULL,
    replaced_by   bigint,
    replaced_via  text NOT NULL CHECK (replaced_via IN ('bot', 'command', 'notes', 'merge')),
    replaced_at   timestamptz NOT NULL,
    reason        text NOT NULL DEFAULT ''
);
CREATE INDEX memory_versions_of_memory ON memory_versions (memory_id, id);
CREATE INDEX memory_versions_written_by ON memory_versions (written_by) WHERE written_by IS NOT NULL;
CREATE INDEX memory_versions_replaced_by ON memory_versions (replaced_by) WHERE replaced_by IS NOT NULL;

-- Memories written down from a finished chat day (day-end notes) say so: source 'notes'.
ALTER TABLE memories DROP CONSTRAINT memories_source_check;
ALTER TABLE memories ADD CONSTRAINT memories_source_check CHECK (source IN ('bot', 'command', 'import', 'notes'));
