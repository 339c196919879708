-- A history chunk holds the text of its messages, so it goes when one of them is edited or deleted
-- (the chunker builds a new one from what is left: chat_messages.chunk_id is set back to NULL by the
-- foreign key). The database keeps this itself, so the chat log that owns the messages never has to
-- touch the history's tables, and no code path can forget it.

CREATE FUNCTION drop_chunks_of_deleted_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM history_chunks WHERE id IN (SELECT chunk_id FROM gone WHERE chunk_id IS NOT NULL);
    RETURN NULL;
END
$$;

CREATE TRIGGER chat_messages_deleted_drop_chunks
    AFTER DELETE ON chat_messages REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION drop_chunks_of_deleted_messages();

CREATE FUNCTION drop_chunks_of_edited_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM history_chunks WHERE id IN (
        SELECT o.chunk_id FROM before_edit o JOIN after_edit n USING (channel_id, message_id)
        WHERE o.chunk_id IS NOT NULL AND o.text IS DISTINCT FROM n.text
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER chat_messages_edited_drop_chunks
    AFTER UPDATE ON chat_messages REFERENCING OLD TABLE AS before_edit NEW TABLE AS after_edit
    FOR EACH STATEMENT EXECUTE FUNCTION drop_chunks_of_edited_messages();
