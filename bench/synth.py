"""Synthetic but realistic memories for the recall benchmark, loaded with COPY.

Shape of the data, chosen to look like real servers rather than a uniform grid:
- many servers; each holds up to its server list (≤ 100; a third are full) and 20–200 users;
- personal lists are skewed: most people have a handful of memories, a few have their full 100,
  some have none; a tenth of personal memories are Global (no persona);
- vectors are 512-dim unit vectors made of a shared "language" direction, a topic centroid and
  noise, so that memories on the query's topic score ~0.45 and unrelated ones ~0.1 — the
  similarity spread a real sentence encoder gives, so `MIN_SIMILARITY` lets a few through;
- counters are spread: about 55% active (0–6 days unused) and 45% dormant (7–90), everything
  last aged yesterday, so the first reply of a day ages the whole searchable set;
- a few channel-limited and tagged memories, users with privacy `full`, blocklist entries.

Loading uses `copy_records_to_table` with pgvector's binary codec: row-by-row INSERTs would take
longer than the benchmark itself at 1M.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import numpy as np

from bot.config import BUILTIN_MODEL
from bot.embeddings import store as embeddings_store
from bot.embeddings.providers import EmbeddingSpace
from bot.memory import store

DIMENSIONS = 512
BASE_DAY = date(2026, 3, 2)  # the benchmark's first chat day; every memory was last aged the day before
SPACE = EmbeddingSpace("builtin", "", BUILTIN_MODEL)
CHUNK = 20_000

TOPICS: dict[str, tuple[str, ...]] = {
    "cats": ("her cat Mochi", "a ginger kitten", "the cat café", "cat treats", "a new scratching post"),
    "dogs": ("his beagle", "the dog park", "puppy training", "a rescue greyhound", "long dog walks"),
    "minecraft": ("the Minecraft server", "a redstone farm", "the nether hub", "modded Minecraft", "a castle build"),
    "elden ring": ("Elden Ring", "a Malenia attempt", "the DLC bosses", "a strength build", "co-op summons"),
    "cooking": ("sourdough bread", "a ramen recipe", "cast iron pans", "homemade pasta", "spicy curry"),
    "coffee": ("pour-over coffee", "a new espresso machine", "oat milk lattes", "cold brew", "light roasts"),
    "running": ("a half marathon", "morning runs", "new running shoes", "interval training", "a 10k race"),
    "climbing": ("bouldering", "the climbing gym", "a V5 problem", "outdoor crags", "chalk and shoes"),
    "music": ("the bass guitar", "a synth patch", "lo-fi playlists", "a jazz concert", "learning piano"),
    "anime": ("Frieren", "a One Piece arc", "the new season", "Studio Ghibli films", "manga volumes"),
    "programming": ("Rust lifetimes", "a Python side project", "the Neovim config", "a home server", "Kubernetes"),
    "study": ("the calculus exam", "a thesis draft", "organic chemistry", "flashcards", "the library"),
    "work": ("a new job", "remote work", "the team standup", "a promotion", "a difficult manager"),
    "travel": ("a trip to Japan", "a Lisbon weekend", "train travel", "cheap flights", "a hostel in Berlin"),
    "movies": ("a horror film", "the Dune sequel", "movie night", "Letterboxd lists", "old westerns"),
    "books": ("a fantasy series", "Brandon Sanderson", "an audiobook", "the book club", "a poetry collection"),
    "fitness": ("leg day", "a deadlift record", "home workouts", "protein shakes", "the gym schedule"),
    "gardening": ("tomato plants", "a balcony garden", "succulents", "compost", "seed starting"),
    "art": ("digital painting", "a commission", "watercolours", "figure drawing", "a sketchbook"),
    "tabletop": ("a D&D campaign", "the dungeon master", "a paladin character", "board game night", "Warhammer minis"),
    "football": ("the Champions League", "a fantasy football team", "Sunday league", "the derby match", "transfer rumours"),
    "weather": ("the heatwave", "snow days", "a thunderstorm", "rainy weekends", "the pollen season"),
    "health": ("a dentist appointment", "sleep schedule", "allergies", "a sprained ankle", "therapy sessions"),
    "family": ("her little brother", "a family reunion", "grandma's birthday", "the twins", "moving back home"),
    "pets": ("a pet rabbit", "the aquarium", "a bearded dragon", "parrot noises", "hamster wheels"),
    "cars": ("an old Civic", "the driving test", "EV charging", "a road trip", "car repairs"),
    "photography": ("a film camera", "golden hour shots", "a 50mm lens", "street photography", "photo editing"),
    "languages": ("learning Japanese", "Duolingo streaks", "Spanish verbs", "a language exchange", "kanji practice"),
    "streaming": ("a Twitch stream", "the stream schedule", "OBS scenes", "subathon plans", "emotes"),
    "fashion": ("thrifted jackets", "sneaker drops", "a tailor", "winter coats", "knitting a scarf"),
    "space": ("the rocket launch", "a telescope", "Mars rovers", "the eclipse", "astrophotography"),
    "food": ("the taco place", "pizza toppings", "bubble tea", "a vegan burger", "street food"),
    "holidays": ("Halloween costumes", "the Christmas party", "Lunar New Year", "a birthday cake", "summer break"),
    "pc hardware": ("a new GPU", "mechanical keyboards", "a PC build", "ultrawide monitors", "water cooling"),
    "mobile games": ("Genshin pulls", "a gacha banner", "Pokémon Go raids", "Clash Royale", "daily logins"),
    "server rules": ("the posting rules", "the moderation team", "the welcome channel", "role colours", "the event calendar"),
}
TOPIC_NAMES = tuple(TOPICS)
NAMES = (
    "Juno", "Mira", "Kai", "Rosa", "Theo", "Ines", "Omar", "Lena", "Ravi", "Noor", "Felix", "Yuki", "Ada", "Leo", "Sana",
    "Ivan", "Zoe", "Marco", "Priya", "Jonas", "Elif", "Tomas", "Aiko", "Ben", "Chloe", "Dario", "Esme", "Gus", "Hana", "Iris",
)
MEMORY_TEMPLATES = (
    "{name} loves {thing}.",
    "{name} is getting into {thing} lately.",
    "{name} does not like {thing}.",
    "{name} talked about {thing} last week.",
    "{name} wants recommendations about {thing}.",
    "{name}'s favourite topic is {thing}.",
    "Ask {name} how {thing} is going.",
)
SERVER_TEMPLATES = (
    "The server has a weekly thread about {thing}.",
    "People here argue a lot about {thing}.",
    "The mods pinned a guide about {thing}.",
    "Most members are into {thing}.",
)
MESSAGE_TEMPLATES = (
    "anyone here into {thing}?",
    "what do you think about {thing}",
    "I finally tried {thing} today",
    "ok but {thing} though",
    "remind me what we said about {thing}",
    "lol same, {thing} is the best",
    "any tips for {thing}?",
)


@dataclass
class Server:
    guild_id: int
    persona_id: int
    channel_ids: tuple[int, ...]
    topics: tuple[int, ...]
    users: list[int]  # every member the bot may see, with or without personal memories
    memory_count: int = 0


@dataclass
class Dataset:
    total: int
    space_id: int
    servers: list[Server]
    centroids: np.ndarray  # (topics, DIMENSIONS)
    language: np.ndarray  # the direction every sentence shares
    blocked: set[tuple[int, int]] = field(default_factory=set)

    def query_vector(self, rng: np.random.Generator, topic: int) -> np.ndarray:
        return synth_vectors(rng, np.array([topic]), self.centroids, self.language)[0]


def synth_vectors(rng: np.random.Generator, topics: np.ndarray, centroids: np.ndarray, language: np.ndarray) -> np.ndarray:
    """0.3·language + 0.6·topic + 0.74·noise, normalized: same topic ≈ 0.45 cosine, others ≈ 0.1."""
    noise = rng.standard_normal((len(topics), DIMENSIONS), dtype=np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    vectors = 0.3 * language[None, :] + 0.6 * centroids[topics] + 0.74 * noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32)


def _unit(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    raw = rng.standard_normal(shape, dtype=np.float32)
    return raw / np.linalg.norm(raw, axis=-1, keepdims=True)


def memory_text(rng: np.random.Generator, topic: int, *, server: bool) -> str:
    thing = str(rng.choice(TOPICS[TOPIC_NAMES[topic]]))
    templates = SERVER_TEMPLATES if server else MEMORY_TEMPLATES
    return str(rng.choice(templates)).format(name=str(rng.choice(NAMES)), thing=thing)


def message_text(rng: np.random.Generator, topic: int) -> str:
    thing = str(rng.choice(TOPICS[TOPIC_NAMES[topic]]))
    return str(rng.choice(MESSAGE_TEMPLATES)).format(thing=thing)


@dataclass
class _Plan:
    """Who holds how many memories, decided before any row is generated."""

    servers: list[Server]
    server_counts: list[int]
    personal: list[tuple[int, int, int]]  # (server index, user id, count)


def _plan(rng: np.random.Generator, total: int, first_persona: int) -> _Plan:
    servers: list[Server] = []
    server_counts: list[int] = []
    personal: list[tuple[int, int, int]] = []
    planned = 0
    next_user = 10**12
    while planned < total:
        index = len(servers)
        guild_id = 10**15 + index
        n_server = 100 if rng.random() < 0.33 else int(rng.integers(5, 100))
        n_users = int(rng.integers(20, 201))
        users = list(range(next_user, next_user + n_users))
        next_user += n_users
        topics = tuple(int(t) for t in rng.choice(len(TOPIC_NAMES), size=8, replace=False))
        channels = tuple(guild_id * 100 + k for k in range(1, 6))
        server = Server(guild_id, first_persona + index, channels, topics, users)
        n_server = min(n_server, total - planned)
        planned += n_server
        counts = []
        for user in users:
            if planned >= total:
                break
            roll = rng.random()
            if roll < 0.3:
                continue  # lurkers with no personal memories
            count = int(rng.integers(40, 101)) if roll > 0.96 else min(100, int(rng.geometric(1 / 8)))
            count = min(count, total - planned)
            planned += count
            counts.append((index, user, count))
        servers.append(server)
        server_counts.append(n_server)
        personal.extend(counts)
        server.memory_count = n_server + sum(c for _, _, c in counts)
    return _Plan(servers, server_counts, personal)


def _counters(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """days_unused (55% active 0-6, 45% dormant 7-90) and whether the memory was ever matched."""
    active = rng.random(n) < 0.55
    days = np.where(active, rng.integers(0, 7, n), 7 + np.minimum(rng.geometric(1 / 15, n), 83))
    matched = rng.random(n) < 0.7
    return days.astype(np.int32), matched


def _memory_rows(rng: np.random.Generator, plan: _Plan) -> Iterator[tuple[list[tuple[object, ...]], np.ndarray]]:
    """Memory records and their topics, in chunks of about CHUNK rows."""
    yesterday = BASE_DAY - timedelta(days=1)
    start = datetime(BASE_DAY.year, BASE_DAY.month, BASE_DAY.day, tzinfo=UTC)
    next_id = 1
    rows: list[tuple[object, ...]] = []
    topics: list[int] = []

    def block(kind: str, server: Server, owner: int | None, count: int) -> None:
        nonlocal next_id
        days, matched = _counters(rng, count)
        for k in range(count):
            topic = server.topics[int(rng.integers(0, len(server.topics)))] if rng.random() < 0.85 else int(
                rng.integers(0, len(TOPIC_NAMES))
            )
            channel_ids = [server.channel_ids[int(rng.integers(0, len(server.channel_ids)))]] if rng.random() < 0.05 else []
            tags = [TOPIC_NAMES[topic].split()[0]] if rng.random() < 0.05 else []
            source = "command" if rng.random() < 0.2 else "bot"
            is_global = kind == "personal" and rng.random() < 0.1
            created = start - timedelta(days=int(days[k]) + int(rng.integers(0, 120)), seconds=int(rng.integers(0, 86400)))
            last_used = created + timedelta(days=int(rng.integers(0, 30))) if matched[k] else None
            rows.append(
                (
                    next_id,
                    kind,
                    server.guild_id if kind == "server" else None,
                    owner,
                    None if is_global else server.persona_id,
                    memory_text(rng, topic, server=kind == "server"),
                    tags,
                    channel_ids,
                    source,
                    source == "command" or is_global,
                    int(days[k]),
                    yesterday,
                    last_used,
                    owner or server.users[0],
                    created,
                    created,
                )
            )
            topics.append(topic)
            next_id += 1

    personal_by_server: dict[int, list[tuple[int, int]]] = {}
    for index, user, count in plan.personal:
        personal_by_server.setdefault(index, []).append((user, count))
    for index, server in enumerate(plan.servers):
        block("server", server, None, plan.server_counts[index])
        for user, count in personal_by_server.get(index, []):
            block("personal", server, user, count)
        if len(rows) >= CHUNK:
            yield rows, np.array(topics)
            rows, topics = [], []
    if rows:
        yield rows, np.array(topics)


MEMORY_COPY_COLUMNS = [
    "id", "list", "guild_id", "owner_id", "persona_id", "text", "tags", "channel_ids", "source", "protected",
    "days_unused", "last_aged_on", "last_used_at", "created_by", "created_at", "updated_at",
]


async def load(url: str, total: int, seed: int = 5, progress: Callable[[str], None] | None = None) -> Dataset:
    """Generate `total` memories and load them into the (freshly migrated) database at `url`."""
    say = progress or (lambda _: None)
    rng = np.random.default_rng(seed)
    centroids = _unit(rng, (len(TOPIC_NAMES), DIMENSIONS))
    language = _unit(rng, (DIMENSIONS,))
    started = time.perf_counter()
    from bot.db import create_pool

    pool = await create_pool(url, max_size=2)
    try:
        async with pool.acquire() as conn:
            space = await embeddings_store.space_id(conn, SPACE)
            first_persona = int(await conn.fetchval("SELECT coalesce(max(id), 0) + 1 FROM personas"))
            plan = _plan(rng, total, first_persona)
            await conn.copy_records_to_table(
                "personas",
                records=[(s.persona_id, s.guild_id, "Deskmate") for s in plan.servers],
                columns=["id", "guild_id", "name"],
            )
            await conn.execute("SELECT setval('personas_id_seq', (SELECT max(id) FROM personas))")
            loaded = 0
            for rows, topics in _memory_rows(rng, plan):
                vectors = synth_vectors(rng, topics, centroids, language)
                await conn.copy_records_to_table("memories", records=rows, columns=MEMORY_COPY_COLUMNS)
                vector_rows = [(row[0], space, v, store.text_hash(str(row[5]))) for row, v in zip(rows, vectors, strict=True)]
                await conn.copy_records_to_table(
                    "memory_vectors", records=vector_rows, columns=["memory_id", "space_id", "embedding", "text_hash"]
                )
                loaded += len(rows)
                say(f"  loaded {loaded:,}/{total:,} memories ({time.perf_counter() - started:.0f} s)")
            await conn.execute("SELECT setval('memories_id_seq', (SELECT max(id) FROM memories))")

            # A few people opted out or are blocked, so the search's hiding rules do real work.
            all_users = [user for server in plan.servers for user in server.users]
            opted_out = rng.choice(all_users, size=max(1, len(all_users) // 100), replace=False)
            await conn.copy_records_to_table(
                "user_settings", records=[(int(u), "full") for u in opted_out], columns=["user_id", "privacy"]
            )
            blocked = {(s.guild_id, s.users[int(rng.integers(0, len(s.users)))]) for s in plan.servers if rng.random() < 0.2}
            await conn.copy_records_to_table("guild_blocklist", records=sorted(blocked), columns=["guild_id", "user_id"])
            settings_rows = [(s.guild_id, bool(rng.random() < 0.9)) for s in plan.servers if rng.random() < 0.3]
            await conn.copy_records_to_table("guild_settings", records=settings_rows, columns=["guild_id", "personal_memories"])
            say("  VACUUM ANALYZE")
            await conn.execute("VACUUM ANALYZE")
    finally:
        await pool.close()
    say(f"  {total:,} memories in {len(plan.servers):,} servers loaded in {time.perf_counter() - started:.0f} s")
    return Dataset(total=total, space_id=space, servers=plan.servers, centroids=centroids, language=language, blocked=blocked)
