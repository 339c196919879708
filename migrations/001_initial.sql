-- Deskmate schema, version 1: memories with decay counters, vectors per embedding space,
-- personas, per-user privacy, per-server settings and blocklist (SPEC §1, §4).
CREATE EXTENSION IF NOT EXISTS vector;

-- A persona speaks in one server (guild_id) or, for the single default persona, in DMs (guild_id NULL).
CREATE TABLE personas (
    id          bigserial PRIMARY KEY,
    guild_id    bigint UNIQUE,
    name        text NOT NULL,
    prompt      text NOT NULL DEFAULT '',
    attributes  jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX personas_one_default ON personas ((guild_id IS NULL)) WHERE guild_id IS NULL;
INSERT INTO personas (guild_id, name) VALUES (NULL, 'Deskmate');

CREATE TABLE memories (
    id            bigserial PRIMARY KEY,
    list          text NOT NULL CHECK (list IN ('server', 'personal')),
    -- server list: the guild; personal list: NULL (the owner is owner_id)
    guild_id      bigint,
    -- personal list: the user the memory is about
    owner_id      bigint,
    -- NULL only for Global personal memories
    persona_id    bigint REFERENCES personas (id) ON DELETE CASCADE,
    text          text NOT NULL CHECK (length(text) BETWEEN 1 AND 4000),
    tags          text[] NOT NULL DEFAULT '{}',
    channel_ids   bigint[] NOT NULL DEFAULT '{}',
    source        text NOT NULL CHECK (source IN ('bot', 'command', 'import')),
    protected     boolean NOT NULL,
    days_unused   integer NOT NULL DEFAULT 0 CHECK (days_unused >= 0),
    last_aged_on  date NOT NULL,
    last_used_at  timestamptz,
    created_by    bigint,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    CHECK (
        (list = 'server' AND guild_id IS NOT NULL AND owner_id IS NULL AND persona_id IS NOT NULL)
        OR (list = 'personal' AND owner_id IS NOT NULL AND guild_id IS NULL)
    )
);
-- The per-reply search filters by owner keys: one server's list plus the participants' lists.
CREATE INDEX memories_server_list ON memories (guild_id, persona_id) WHERE list = 'server';
CREATE INDEX memories_personal_list ON memories (owner_id, persona_id) WHERE list = 'personal';

-- An embedding space is provider + base URL + model: two models of equal dimension never mix.
CREATE TABLE embedding_spaces (
    id          serial PRIMARY KEY,
    provider    text NOT NULL,
    base_url    text NOT NULL,
    model       text NOT NULL,
    dimensions  integer,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, base_url, model)
);

CREATE TABLE memory_vectors (
    memory_id   bigint NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    space_id    integer NOT NULL REFERENCES embedding_spaces (id) ON DELETE CASCADE,
    embedding   vector NOT NULL,
    -- the text the vector was computed from, so an edit racing a re-embed never keeps a stale vector
    text_hash   text NOT NULL,
    PRIMARY KEY (memory_id, space_id)
);
CREATE INDEX memory_vectors_space ON memory_vectors (space_id);

CREATE TABLE user_settings (
    user_id     bigint PRIMARY KEY,
    privacy     text NOT NULL DEFAULT 'none' CHECK (privacy IN ('none', 'partial', 'full')),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE guild_settings (
    guild_id           bigint PRIMARY KEY,
    notices            text NOT NULL DEFAULT 'visible' CHECK (notices IN ('visible', 'hidden', 'log')),
    notice_verbosity   text NOT NULL DEFAULT 'minimal' CHECK (notice_verbosity IN ('minimal', 'verbose')),
    log_channel_id     bigint,
    self_teaching      boolean NOT NULL DEFAULT true,
    member_teaching    boolean NOT NULL DEFAULT false,
    personal_memories  boolean NOT NULL DEFAULT true,
    tagging            boolean NOT NULL DEFAULT false,
    auto_reply_channel_ids bigint[] NOT NULL DEFAULT '{}',
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE guild_blocklist (
    guild_id    bigint NOT NULL,
    user_id     bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (guild_id, user_id)
);
