-- Deskmate schema, version 9: summaries of each channel's chat days and weeks.

-- A thread's messages are summarised with its parent channel, so the chat log keeps the parent of
-- every message it stores (NULL outside threads, and for messages stored before this version).
ALTER TABLE chat_messages ADD COLUMN parent_channel_id bigint;
CREATE INDEX chat_messages_by_summary_channel ON chat_messages ((coalesce(parent_channel_id, channel_id)), created_at);

-- One row per channel and chat day ('day', period_start = the chat day) or week ('week', period_start =
-- its Monday). `status`: 'ready' (has a summary), 'missing' (the summary model failed; retried from
-- `retry_on` on), 'empty' (nothing could be summarised: only blocked or fully private people spoke),
-- 'deleted' (an admin deleted it: kept out of the prompt and not regenerated until asked to).
-- `author_ids` are the people whose messages it was built from, so delete-my-data finds every summary
-- that may carry someone's words; `first_message_id`..`last_message_id` are the messages it covers, so an
-- edit or deletion marks it `stale` (see the triggers below). An edited summary (`edited_by`) is never
-- overwritten. A day folded into its week summary points at it (`folded_into`).
CREATE TABLE channel_summaries (
    id                bigserial PRIMARY KEY,
    channel_id        bigint NOT NULL,
    guild_id          bigint,
    kind              text NOT NULL CHECK (kind IN ('day', 'week')),
    period_start      date NOT NULL,
    status            text NOT NULL CHECK (status IN ('ready', 'missing', 'empty', 'deleted')),
    summary           text NOT NULL DEFAULT '',
    key_details       jsonb NOT NULL DEFAULT '[]',
    author_ids        bigint[] NOT NULL DEFAULT '{}',
    first_message_id  bigint,
    last_message_id   bigint,
    message_count     integer NOT NULL DEFAULT 0,
    stale             boolean NOT NULL DEFAULT false,
    folded_into       bigint REFERENCES channel_summaries (id) ON DELETE SET NULL,
    edited_by         bigint,
    edited_at         timestamptz,
    attempts          integer NOT NULL DEFAULT 0,
    retry_on          date,
    last_error        text,
    model             text,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    UNIQUE (channel_id, kind, period_start)
);
CREATE INDEX channel_summaries_guild ON channel_summaries (guild_id);
CREATE INDEX channel_summaries_authors ON channel_summaries USING gin (author_ids);

-- Summaries on or off for a server (scope_id = the server's id) or one channel (its id); on by default.
CREATE TABLE summary_switches (
    scope_id    bigint PRIMARY KEY,
    guild_id    bigint,
    enabled     boolean NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- An edited or deleted message makes the day summary that covers it stale: it is regenerated at the next
-- day rollover. The database keeps this itself, as it does for history chunks, so the chat log that owns
-- the messages never touches the summaries' tables.
CREATE FUNCTION mark_summaries_of_changed_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE channel_summaries s SET stale = true
    FROM changed c
    WHERE s.kind = 'day' AND NOT s.stale
      AND s.channel_id = coalesce(c.parent_channel_id, c.channel_id)
      AND c.message_id BETWEEN s.first_message_id AND s.last_message_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION mark_summaries_of_edited_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE channel_summaries s SET stale = true
    FROM before_edit o JOIN after_edit n USING (channel_id, message_id)
    WHERE o.text IS DISTINCT FROM n.text
      AND s.kind = 'day' AND NOT s.stale
      AND s.channel_id = coalesce(o.parent_channel_id, o.channel_id)
      AND o.message_id BETWEEN s.first_message_id AND s.last_message_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER chat_messages_deleted_mark_summaries
    AFTER DELETE ON chat_messages REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION mark_summaries_of_changed_messages();

CREATE TRIGGER chat_messages_edited_mark_summaries
    AFTER UPDATE ON chat_messages REFERENCING OLD TABLE AS before_edit NEW TABLE AS after_edit
    FOR EACH STATEMENT EXECUTE FUNCTION mark_summaries_of_edited_messages();
