-- Deskmate schema, version 5 (issue 4, SPEC §8): chat-history chunks, documents and their
-- passages, each with vectors per embedding space, and the per-channel history-recall switch.

-- A chunk is a run of consecutive messages of one channel, closed in the background once the
-- messages have left the context window. Its text is built from the messages as they were at
-- chunking time; editing or deleting one of them deletes the chunk, and the background task
-- builds a new one from what is left (chat_messages.chunk_id goes back to NULL on delete).
CREATE TABLE history_chunks (
    id                bigserial PRIMARY KEY,
    guild_id          bigint,
    channel_id        bigint NOT NULL,
    first_message_id  bigint NOT NULL,
    last_message_id   bigint NOT NULL,
    message_ids       bigint[] NOT NULL,
    author_ids        bigint[] NOT NULL,
    started_at        timestamptz NOT NULL,
    ended_at          timestamptz NOT NULL,
    text              text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX history_chunks_channel ON history_chunks (channel_id, last_message_id);
CREATE INDEX history_chunks_guild ON history_chunks (guild_id);

ALTER TABLE chat_messages ADD COLUMN chunk_id bigint REFERENCES history_chunks (id) ON DELETE SET NULL;
-- "the messages of this chunk" (ON DELETE SET NULL, edits and deletes) ...
CREATE INDEX chat_messages_chunk ON chat_messages (chunk_id) WHERE chunk_id IS NOT NULL;
-- ... and "the messages not in a chunk yet" (the background chunker), which stay few per channel.
CREATE INDEX chat_messages_unchunked ON chat_messages (channel_id, message_id) WHERE chunk_id IS NULL;

CREATE TABLE history_chunk_vectors (
    chunk_id    bigint NOT NULL REFERENCES history_chunks (id) ON DELETE CASCADE,
    space_id    integer NOT NULL REFERENCES embedding_spaces (id) ON DELETE CASCADE,
    embedding   vector NOT NULL,
    PRIMARY KEY (chunk_id, space_id)
);
CREATE INDEX history_chunk_vectors_space ON history_chunk_vectors (space_id);
ALTER TABLE history_chunk_vectors ALTER COLUMN embedding SET STORAGE MAIN;

-- Per-channel history recall (default on). Storing and chunking go on when it is off.
CREATE TABLE history_channels (
    channel_id      bigint PRIMARY KEY,
    guild_id        bigint,
    recall_enabled  boolean NOT NULL DEFAULT true,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Documents a server's admins upload (/documents add), split into passages.
CREATE TABLE documents (
    id           bigserial PRIMARY KEY,
    guild_id     bigint NOT NULL,
    name         text NOT NULL,
    size_bytes   integer NOT NULL,
    sha256       text NOT NULL,
    added_by     bigint,
    created_at   timestamptz NOT NULL,
    UNIQUE (guild_id, name)
);

CREATE TABLE document_passages (
    id           bigserial PRIMARY KEY,
    document_id  bigint NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    guild_id     bigint NOT NULL,
    ordinal      integer NOT NULL,
    section      text NOT NULL DEFAULT '',
    text         text NOT NULL,
    UNIQUE (document_id, ordinal)
);
CREATE INDEX document_passages_guild ON document_passages (guild_id);

CREATE TABLE document_passage_vectors (
    passage_id  bigint NOT NULL REFERENCES document_passages (id) ON DELETE CASCADE,
    space_id    integer NOT NULL REFERENCES embedding_spaces (id) ON DELETE CASCADE,
    embedding   vector NOT NULL,
    PRIMARY KEY (passage_id, space_id)
);
CREATE INDEX document_passage_vectors_space ON document_passage_vectors (space_id);
ALTER TABLE document_passage_vectors ALTER COLUMN embedding SET STORAGE MAIN;
