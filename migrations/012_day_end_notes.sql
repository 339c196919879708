-- Deskmate schema, version 12: day-end notes, what a finished chat day taught, written down as memories by the
-- summary pass (docs/memory-rules.md, "Versions and day-end notes").

-- The messages a note's text came from (a day-end note, or a day-end correction of a memory). A memory whose
-- text came from day-end notes (source 'notes') goes when one of those messages is deleted: withdrawal wins,
-- also for what was written down from it. Any other change of the text clears these rows (the text is no
-- longer the note's), and a correction replaces them with its own.
CREATE TABLE memory_sources (
    memory_id   bigint NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    channel_id  bigint NOT NULL,
    message_id  bigint NOT NULL,
    author_id   bigint NOT NULL,
    PRIMARY KEY (memory_id, channel_id, message_id)
);
CREATE INDEX memory_sources_message ON memory_sources (channel_id, message_id);
CREATE INDEX memory_sources_author ON memory_sources (author_id);

CREATE FUNCTION forget_notes_of_deleted_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memories m
    USING memory_sources s, gone g
    WHERE s.memory_id = m.id AND m.source = 'notes'
      AND s.channel_id = g.channel_id AND s.message_id = g.message_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER chat_messages_deleted_forget_notes
    AFTER DELETE ON chat_messages REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION forget_notes_of_deleted_messages();

-- Messages of a private thread say so: what is said there never leaves it, so no day-end note comes from them.
-- Messages stored before the bot knew the thread was private are marked when it learns; a note already written
-- from one of them goes, as for a deleted message.
ALTER TABLE chat_messages ADD COLUMN private_thread boolean NOT NULL DEFAULT false;

CREATE FUNCTION forget_notes_of_private_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memories m
    USING memory_sources s, now_private n JOIN was_public o USING (channel_id, message_id)
    WHERE s.memory_id = m.id AND m.source = 'notes' AND n.private_thread AND NOT o.private_thread
      AND s.channel_id = n.channel_id AND s.message_id = n.message_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER chat_messages_private_forget_notes
    AFTER UPDATE ON chat_messages REFERENCING OLD TABLE AS was_public NEW TABLE AS now_private
    FOR EACH STATEMENT EXECUTE FUNCTION forget_notes_of_private_messages();

-- Whether the author had Manage Server where they wrote: a day-end note acts for the person whose words it
-- comes from, never with more rights than they had (a correction of a server memory needs what a command
-- edit would need).
ALTER TABLE chat_messages ADD COLUMN author_can_manage boolean NOT NULL DEFAULT false;

-- One row per channel and chat day whose notes were written: a day's notes are written once (a summary
-- regenerated later, or a stale day, never writes them again), and never for a day older than one already
-- noted, so an old day cannot undo a newer correction. Counts only: no text, nobody's id.
CREATE TABLE day_notes (
    channel_id    bigint NOT NULL,
    period_start  date NOT NULL,
    guild_id      bigint,
    written_at    timestamptz NOT NULL,
    saved         integer NOT NULL DEFAULT 0,
    updated       integer NOT NULL DEFAULT 0,
    refused       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (channel_id, period_start)
);
CREATE INDEX day_notes_guild ON day_notes (guild_id);
