-- Deskmate schema, version 2: what the reply pipeline needs (issue 3, SPEC §5, §6, §8).

-- Every message of a channel as it arrives (bots included: the bot's own replies are the
-- assistant turns of the prompt). The context window is "the last N of a channel"; older rows
-- stay for chat-history recall. Discord message ids are snowflakes, so ordering by message_id
-- is ordering by time, and the console generates ids the same way.
CREATE TABLE chat_messages (
    channel_id   bigint NOT NULL,
    message_id   bigint NOT NULL,
    guild_id     bigint,
    author_id    bigint NOT NULL,
    author_name  text NOT NULL,
    is_bot       boolean NOT NULL DEFAULT false,
    text         text NOT NULL,
    reply_to     bigint,
    mention_ids  bigint[] NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL,
    edited_at    timestamptz,
    PRIMARY KEY (channel_id, message_id)
);
-- The primary key already serves "last N of a channel" (backward index scan); this one serves
-- "delete everything this user wrote" (/privacy delete-my-data).
CREATE INDEX chat_messages_author ON chat_messages (author_id);

-- The latest display name of every user the bot has seen, so personal memories are labelled
-- the same way on every reply (the prompt head must not depend on who is in the window).
CREATE TABLE chat_users (
    user_id     bigint PRIMARY KEY,
    name        text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Always-on lore: facts and rules a server's admins want in every prompt of its persona.
CREATE TABLE lore_entries (
    id          bigserial PRIMARY KEY,
    persona_id  bigint NOT NULL REFERENCES personas (id) ON DELETE CASCADE,
    text        text NOT NULL CHECK (length(text) BETWEEN 1 AND 4000),
    created_by  bigint,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lore_entries_persona ON lore_entries (persona_id, id);

-- One receipt per reply (SPEC §8): why each memory was in the prompt, token counts, and the
-- hash of the prompt head, so the next reply in the channel can tell whether the cache held.
CREATE TABLE reply_receipts (
    id           bigserial PRIMARY KEY,
    guild_id     bigint,
    channel_id   bigint NOT NULL,
    message_id   bigint NOT NULL,
    head_hash    text NOT NULL,
    receipt      jsonb NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE INDEX reply_receipts_channel ON reply_receipts (channel_id, id DESC);
CREATE INDEX reply_receipts_message ON reply_receipts (message_id);
