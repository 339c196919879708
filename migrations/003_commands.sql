-- Deskmate schema, version 3: what the slash commands need beyond the memory core (SPEC §6, §8).

-- Member teaching lets people change the server memories they added themselves, and
-- /privacy delete-my-data clears the author of the server memories a user added: both look
-- memories up by author, which no other index covers.
CREATE INDEX IF NOT EXISTS memories_created_by ON memories (created_by) WHERE created_by IS NOT NULL;
