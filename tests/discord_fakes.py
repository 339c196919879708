"""A small Discord on 127.0.0.1 for tests: REST API + gateway, so discord.py runs unmodified.

`FakeDiscord` is a real aiohttp server. `discord.http.Route.BASE` points at it while it runs, so
both the bot's HTTP client and the interaction webhooks talk to it; `GET /gateway/bot` hands out
its own websocket, which speaks enough of the gateway (HELLO, IDENTIFY, READY, GUILD_CREATE,
heartbeats, dispatch) for `AutoShardedBot.start` to connect. Every request is recorded, and
messages and interaction responses are kept so tests can look at them and press their buttons.

Payload builders (`slash`, `autocomplete`, `button`, `modal_submit`, ...) make the interaction
payloads Discord would send; `SlashHarness.run` feeds one through discord.py's own
`ConnectionState.parse_interaction_create` (the gateway path) and waits for the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import discord
import yarl
from aiohttp import WSMsgType, web

from bot.bot import DeskmateBot
from bot.memory.service import MemoryCore
from bot.services import build_services
from tests.fakes import serve_locally

BOT_ID = 900_000_000_000_000_001
GUILD_ID = 900_000_000_000_000_100
GENERAL_ID = 900_000_000_000_000_200
OTHER_CHANNEL_ID = 900_000_000_000_000_201
LOG_CHANNEL_ID = 900_000_000_000_000_202
EPHEMERAL = 64
MANAGE_GUILD = 1 << 5
SEND_MESSAGES = (1 << 11) | (1 << 10)  # send + view channel
MEMBER_PERMISSIONS = SEND_MESSAGES | (1 << 16)  # + read message history
ADMIN_PERMISSIONS = MEMBER_PERMISSIONS | MANAGE_GUILD


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """discord.py parses a body as JSON only when Content-Type is exactly application/json (no charset)."""
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json", **(headers or {})}
    )


# Discord's documented message limits; a body over any of them is refused with 400 (code 50035), as Discord does.
CONTENT_LIMIT, EMBEDS_LIMIT, EMBED_TOTAL_LIMIT, FIELDS_LIMIT = 2000, 10, 6000, 25
EMBED_PART_LIMITS = {"title": 256, "description": 4096}
FIELD_NAME_LIMIT, FIELD_VALUE_LIMIT, FOOTER_LIMIT = 256, 1024, 2048


def limit_problems(data: dict[str, Any]) -> list[str]:
    """What Discord would refuse in a message body (content and embeds), as short sentences."""
    problems = []
    content = data.get("content") or ""
    if len(content) > CONTENT_LIMIT:
        problems.append(f"content has {len(content)} characters (limit {CONTENT_LIMIT})")
    embeds = data.get("embeds") or []
    if len(embeds) > EMBEDS_LIMIT:
        problems.append(f"{len(embeds)} embeds (limit {EMBEDS_LIMIT})")
    total = 0
    for embed in embeds:
        for part, limit in EMBED_PART_LIMITS.items():
            size = len(embed.get(part) or "")
            total += size
            if size > limit:
                problems.append(f"embed {part} has {size} characters (limit {limit})")
        footer = len((embed.get("footer") or {}).get("text") or "")
        total += footer
        if footer > FOOTER_LIMIT:
            problems.append(f"embed footer has {footer} characters (limit {FOOTER_LIMIT})")
        fields = embed.get("fields") or []
        if len(fields) > FIELDS_LIMIT:
            problems.append(f"embed has {len(fields)} fields (limit {FIELDS_LIMIT})")
        for item in fields:
            total += len(item.get("name") or "") + len(item.get("value") or "")
            if len(item.get("name") or "") > FIELD_NAME_LIMIT or len(item.get("value") or "") > FIELD_VALUE_LIMIT:
                problems.append(f"embed field {item.get('name')!r} is over {FIELD_NAME_LIMIT}/{FIELD_VALUE_LIMIT} characters")
    if total > EMBED_TOTAL_LIMIT:
        problems.append(f"embeds have {total} characters in all (limit {EMBED_TOTAL_LIMIT})")
    return problems


def invalid_form(problems: list[str]) -> web.Response:
    return _json({"message": "Invalid Form Body", "code": 50035, "errors": {"_errors": problems}}, status=400)


@dataclass
class Failure:
    """An error the fake answers instead of success, `times` times (None: until removed from `FakeDiscord.failures`)."""

    method: str
    path: str
    status: int
    code: int = 0
    message: str = ""
    retry_after: float | None = None
    times: int | None = None
    hits: int = 0
    errors: dict[str, Any] | None = None  # Discord's per-field details of a 400 (code 50035)

    def response(self) -> web.Response:
        self.hits += 1
        if self.times is not None:
            self.times -= 1
        if self.status == 429:  # discord.py treats a 429 without a Via header as a Cloudflare ban
            body = {"message": "You are being rate limited.", "retry_after": self.retry_after or 0.1, "global": False}
            return _json(body, status=429, headers={"Via": "1.1 google", "Retry-After": str(int(self.retry_after or 1))})
        body: dict[str, Any] = {"message": self.message or f"{self.status} error", "code": self.code}
        if self.errors is not None:
            body["errors"] = self.errors
        return _json(body, status=self.status)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


_snowflakes = itertools.count(discord.utils.time_snowflake(datetime.now(UTC)))


def snowflake() -> int:
    return next(_snowflakes)


def user_payload(user_id: int, name: str, *, bot: bool = False) -> dict[str, Any]:
    return {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name, "avatar": None, "bot": bot,
            "public_flags": 0}


BOT_USER = user_payload(BOT_ID, "Deskmate", bot=True)


def channel_payload(channel_id: int, name: str, guild_id: int = GUILD_ID, kind: int = 0) -> dict[str, Any]:
    return {"id": str(channel_id), "type": kind, "name": name, "guild_id": str(guild_id), "position": 0,
            "permission_overwrites": [], "nsfw": False, "parent_id": None, "topic": None, "rate_limit_per_user": 0}


def guild_payload(
    guild_id: int = GUILD_ID, name: str = "Juno's den", channels: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A GUILD_CREATE payload: a few text channels, @everyone able to talk, and the bot as a member."""
    channels = channels or [
        channel_payload(GENERAL_ID, "general", guild_id),
        channel_payload(OTHER_CHANNEL_ID, "games", guild_id),
        channel_payload(LOG_CHANNEL_ID, "bot-log", guild_id),
    ]
    everyone = {"id": str(guild_id), "name": "@everyone", "permissions": str(MEMBER_PERMISSIONS), "position": 0, "color": 0,
                "hoist": False, "managed": False, "mentionable": False, "flags": 0}
    bot_member = {"user": BOT_USER, "roles": [], "joined_at": now_iso(), "deaf": False, "mute": False, "flags": 0}
    return {
        "id": str(guild_id), "name": name, "icon": None, "owner_id": "1", "afk_timeout": 300, "verification_level": 0,
        "default_message_notifications": 0, "explicit_content_filter": 0, "roles": [everyone], "emojis": [], "stickers": [],
        "features": [], "mfa_level": 0, "system_channel_flags": 0, "premium_tier": 0, "preferred_locale": "en-US",
        "nsfw_level": 0, "unavailable": False, "member_count": 3, "large": False, "joined_at": now_iso(),
        "channels": channels, "threads": [], "members": [bot_member], "voice_states": [], "presences": [],
        "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [],
    }


def message_payload(
    *,
    channel_id: int,
    author: dict[str, Any],
    content: str,
    guild_id: int | None = GUILD_ID,
    message_id: int | None = None,
    mentions: list[dict[str, Any]] | None = None,
    referenced: dict[str, Any] | None = None,
    embeds: list[dict[str, Any]] | None = None,
    components: list[dict[str, Any]] | None = None,
    flags: int = 0,
    attachments: list[dict[str, Any]] | None = None,
    kind: int = 0,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(message_id or snowflake()), "channel_id": str(channel_id), "author": author, "content": content,
        "timestamp": now_iso(), "edited_timestamp": None, "tts": False, "mention_everyone": False,
        "mentions": mentions or [], "mention_roles": [], "attachments": attachments or [], "embeds": embeds or [],
        "components": components or [], "pinned": False, "type": kind, "flags": flags,
    }
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
        data["member"] = {"roles": [], "joined_at": now_iso(), "deaf": False, "mute": False, "flags": 0}
    if referenced is not None:
        data["type"] = 19
        data["referenced_message"] = referenced
        data["message_reference"] = {"message_id": referenced["id"], "channel_id": referenced["channel_id"]}
    return data


@dataclass
class Call:
    """One HTTP request the bot made."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def data(self) -> dict[str, Any]:
        """The message data of an interaction callback or a message body."""
        if self.body is None:
            return {}
        return self.body.get("data", self.body) if "type" in self.body and "data" in self.body else self.body

    @property
    def flags(self) -> int:
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)

    @property
    def content(self) -> str:
        return self.data.get("content") or ""

    @property
    def embeds(self) -> list[dict[str, Any]]:
        return self.data.get("embeds") or []

    def text(self) -> str:
        """Content plus every embed's title, description, field names/values and footer, for assertions."""
        parts = [self.content]
        for embed in self.embeds:
            parts += [embed.get("title") or "", embed.get("description") or "", (embed.get("footer") or {}).get("text", "")]
            for item in embed.get("fields") or []:
                parts += [item["name"], item["value"]]
        return "\n".join(part for part in parts if part)


class FakeDiscord:
    """Discord's REST API and gateway, on a free port of 127.0.0.1."""

    def __init__(self, guilds: list[dict[str, Any]] | None = None) -> None:
        self.guilds = guilds if guilds is not None else [guild_payload()]
        self.token_ok = True  # False: answer logins with 401, like a wrong DISCORD_TOKEN
        self.gateway_up = True  # False: the gateway refuses connections (see `drop_gateway`)
        self.calls: list[Call] = []
        self.messages: dict[int, dict[str, Any]] = {}
        self.attachments: dict[str, bytes] = {}
        self.sockets: list[web.WebSocketResponse] = []
        self.identified = asyncio.Event()
        self.received: list[dict[str, Any]] = []  # gateway frames from the bot
        self.failures: list[Failure] = []  # errors to answer instead of success (see `fail`)
        self.shards: dict[int, tuple[int, int]] = {}  # id(socket) -> (shard id, shard count) from its IDENTIFY
        self.refused: list[tuple[Call, list[str]]] = []  # bodies refused for breaking Discord's limits
        self._originals: dict[str, int] = {}  # interaction token -> message id of its original response
        self._changed = asyncio.Condition()
        self._sequence = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._old_base = discord.http.Route.BASE
        self._old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
        self.port = 0

    # --- lifecycle ---

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeDiscord:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/attachments/{name}", self._attachment)
        app.router.add_route("*", "/api/v10/{path:.*}", self._rest)
        self._runner, self.port = await serve_locally(app, shutdown_timeout=0.5)
        discord.http.Route.BASE = f"{self.base}/api/v10"
        # With a fixed SHARD_COUNT discord.py skips GET /gateway/bot and dials its built-in gateway address.
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(f"ws://127.0.0.1:{self.port}/gateway")
        return self

    async def __aexit__(self, *exc: object) -> None:
        discord.http.Route.BASE = self._old_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = self._old_gateway
        for socket in list(self.sockets):
            with contextlib.suppress(Exception):
                await socket.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- inspection ---

    async def _record(self, call: Call) -> None:
        async with self._changed:
            self.calls.append(call)
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[Call], bool], within: float = 10.0, *, after: int = 0) -> Call:
        """The first call (from index `after`) matching `predicate`, waiting for it if needed."""
        async def found() -> Call:
            async with self._changed:
                while True:
                    for call in self.calls[after:]:
                        if predicate(call):
                            return call
                    await self._changed.wait()

        return await asyncio.wait_for(found(), within)

    def find(self, predicate: Callable[[Call], bool]) -> list[Call]:
        return [call for call in self.calls if predicate(call)]

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        code: int = 0,
        message: str = "",
        retry_after: float | None = None,
        times: int | None = None,
        errors: dict[str, Any] | None = None,
    ) -> Failure:
        """Answer `method path` (e.g. "POST", "/channels/1/messages") with an error until removed or `times` ran out."""
        failure = Failure(method, path, status, code, message, retry_after, times, errors=errors)
        self.failures.append(failure)
        return failure

    def add_attachment(self, filename: str, raw: bytes, content_type: str = "application/json") -> dict[str, Any]:
        """Serve `raw` as a Discord attachment and return its payload (for `resolved.attachments`)."""
        attachment_id = snowflake()
        name = f"{attachment_id}-{filename}"
        self.attachments[name] = raw
        url = f"{self.base}/attachments/{name}"
        return {"id": str(attachment_id), "filename": filename, "size": len(raw), "url": url, "proxy_url": url,
                "content_type": content_type}

    # --- REST ---

    async def _attachment(self, request: web.Request) -> web.Response:
        raw = self.attachments.get(request.match_info["name"])
        return web.Response(body=raw) if raw is not None else web.Response(status=404)

    async def _read(self, request: web.Request) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            files: dict[str, bytes] = {}
            body = None
            for key, value in form.items():
                if key == "payload_json":
                    body = json.loads(str(value))
                elif isinstance(value, web.FileField):
                    files[value.filename or key] = value.file.read()
            return body, files
        if request.can_read_body:
            text = await request.text()
            return (json.loads(text) if text else None), {}
        return None, {}

    def _bot_message(self, channel_id: int, body: dict[str, Any], files: dict[str, bytes], *, flags: int = 0) -> dict[str, Any]:
        attachments = [
            {"id": str(snowflake()), "filename": name, "size": len(raw), "url": f"{self.base}/attachments/x", "proxy_url": ""}
            for name, raw in files.items()
        ]
        channel = self._channel_guild(channel_id)
        message = message_payload(
            channel_id=channel_id, author=BOT_USER, content=body.get("content") or "", guild_id=channel,
            embeds=body.get("embeds"), components=body.get("components"), flags=int(body.get("flags") or flags),
            attachments=attachments,
        )
        if body.get("message_reference"):
            message["message_reference"] = body["message_reference"]
        self.messages[int(message["id"])] = message
        return message

    def _channel_guild(self, channel_id: int) -> int | None:
        for guild in self.guilds:
            if any(int(c["id"]) == channel_id for c in guild["channels"]):
                return int(guild["id"])
        return None

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        body, files = await self._read(request)
        call = Call(request.method, path, dict(request.query), body, files)
        await self._record(call)
        parts = path.strip("/").split("/")
        method = request.method
        for failure in self.failures:
            if failure.method == method and failure.path == path and (failure.times is None or failure.times > 0):
                return failure.response()
        if method in ("POST", "PATCH") and body is not None:
            problems = limit_problems(call.data)
            if problems:
                self.refused.append((call, problems))
                return invalid_form(problems)
        if path == "/users/@me":
            if not self.token_ok:
                return _json({"message": "401: Unauthorized", "code": 0}, status=401)
            return _json(BOT_USER)
        if path == "/oauth2/applications/@me":
            return _json({
                "id": str(BOT_ID), "name": "Deskmate", "icon": None, "description": "", "bot_public": True,
                "bot_require_code_grant": False, "verify_key": "0" * 64, "flags": 1 << 19, "owner": user_payload(1, "owner"),
                "team": None, "summary": "", "rpc_origins": [],
            })
        if path == "/gateway/bot":
            return _json({"url": f"ws://127.0.0.1:{self.port}/gateway", "shards": 1,
                                      "session_start_limit": {"total": 1000, "remaining": 1000, "reset_after": 0,
                                                              "max_concurrency": 1}})
        if parts[0] == "applications" and parts[-1] == "commands" and method == "PUT":
            return _json([
                {**command, "id": str(snowflake()), "application_id": str(BOT_ID), "version": "1"} for command in body or []
            ])
        if parts[0] == "applications" and method == "GET":
            return _json([])
        if parts[0] == "interactions" and parts[-1] == "callback":
            return _json(self._interaction_callback(int(parts[1]), parts[2], body or {}, files))
        if parts[0] == "webhooks":
            return self._webhook(method, parts, body or {}, files)
        if parts[0] == "channels" and len(parts) >= 3:
            channel_id = int(parts[1])
            if parts[2] == "typing":
                return web.Response(status=204)
            if parts[2] == "messages" and method == "POST":
                message = self._bot_message(channel_id, body or {}, files)
                if self.sockets:  # Discord echoes the bot's own messages on the gateway
                    asyncio.get_running_loop().create_task(self.dispatch("MESSAGE_CREATE", message))
                return _json(message)
            if parts[2] == "messages" and method == "GET" and len(parts) == 3:  # channel history, newest first
                before = int(request.query.get("before", 2**63 - 1))
                limit = int(request.query.get("limit", 50))
                found = sorted(
                    (m for m in self.messages.values() if int(m["channel_id"]) == channel_id and int(m["id"]) < before),
                    key=lambda m: int(m["id"]),
                    reverse=True,
                )
                return _json(found[:limit])
        return _json({"message": f"fake Discord does not know {method} {path}", "code": 0}, status=404)

    def _interaction_callback(
        self, interaction_id: int, token: str, body: dict[str, Any], files: dict[str, bytes]
    ) -> dict[str, Any]:
        kind = body.get("type")
        data = body.get("data") or {}
        interaction = {"id": str(interaction_id), "type": 2}
        response: dict[str, Any] = {"interaction": interaction}
        channel_id = GENERAL_ID
        if kind in (4, 5):  # a message, or "thinking" (deferred) that a followup fills in
            message = self._bot_message(channel_id, data if kind == 4 else {"flags": data.get("flags", 0)}, files)
            self._originals[token] = int(message["id"])
            interaction.update(response_message_id=message["id"], response_message_loading=kind == 5,
                               response_message_ephemeral=bool(int(data.get("flags") or 0) & EPHEMERAL))
            response["resource"] = {"type": kind, "message": message}
        elif kind == 7:  # edit the message the component is on
            original = self._originals.get(token)
            if original is not None:
                self.messages[original].update({k: v for k, v in data.items() if k in ("content", "embeds", "components")})
                response["resource"] = {"type": 7, "message": self.messages[original]}
        return response

    def _webhook(self, method: str, parts: list[str], body: dict[str, Any], files: dict[str, bytes]) -> web.Response:
        token = parts[2]
        if len(parts) >= 5 and parts[3] == "messages":
            original = self._originals.get(token) if parts[4] == "@original" else int(parts[4])
            if original is None or original not in self.messages:
                return _json({"message": "Unknown Message", "code": 10008}, status=404)
            if method == "PATCH":
                self.messages[original].update({k: v for k, v in body.items() if k in ("content", "embeds", "components")})
            return _json(self.messages[original])
        if method == "POST":  # a followup message
            message = self._bot_message(GENERAL_ID, body, files)
            self._originals.setdefault(token, int(message["id"]))
            return _json(message)
        return _json({"message": "not supported", "code": 0}, status=404)

    # --- gateway ---

    async def drop_gateway(self) -> None:
        """A gateway outage: every connection is closed and new ones are refused until `gateway_up` is True again."""
        self.gateway_up = False
        for socket in list(self.sockets):
            with contextlib.suppress(Exception):
                await socket.close()

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if not self.gateway_up:
            return web.Response(status=503, text="the gateway is down")
        socket = web.WebSocketResponse(max_msg_size=0)
        await socket.prepare(request)
        self.sockets.append(socket)
        await socket.send_json({"op": 10, "d": {"heartbeat_interval": 41_250}, "s": None, "t": None})
        try:
            async for frame in socket:
                if frame.type != WSMsgType.TEXT:
                    continue
                payload = json.loads(frame.data)
                self.received.append(payload)
                if payload["op"] == 1:
                    await socket.send_json({"op": 11, "d": None, "s": None, "t": None})
                elif payload["op"] == 2:
                    await self._ready(socket, payload["d"])
        finally:
            if socket in self.sockets:
                self.sockets.remove(socket)
        return socket

    def shard_of_socket(self, socket: web.WebSocketResponse) -> tuple[int, int] | None:
        return self.shards.get(id(socket))

    def owns(self, socket: web.WebSocketResponse, guild_id: int | None) -> bool:
        """Whether Discord would send this guild's events on this connection: (guild_id >> 22) % shard_count
        picks the shard, and direct messages go to shard 0."""
        shard = self.shard_of_socket(socket)
        if shard is None:
            return False
        number, count = shard
        return number == (0 if guild_id is None else (guild_id >> 22) % count)

    async def _ready(self, socket: web.WebSocketResponse, identify: dict[str, Any]) -> None:
        shard = identify.get("shard", [0, 1])
        self.shards[id(socket)] = (int(shard[0]), int(shard[1]))
        mine = [g for g in self.guilds if self.owns(socket, int(g["id"]))]
        ready = {
            "v": 10, "user": BOT_USER, "guilds": [{"id": g["id"], "unavailable": True} for g in mine],
            "session_id": "fake-session", "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway", "shard": shard,
            "application": {"id": str(BOT_ID), "flags": 1 << 19}, "private_channels": [], "relationships": [],
        }
        await socket.send_json({"op": 0, "t": "READY", "s": next(self._sequence), "d": ready})
        for guild in mine:
            await socket.send_json({"op": 0, "t": "GUILD_CREATE", "s": next(self._sequence), "d": guild})
        self.identified.set()

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send an event on the connection of the shard that owns its guild (every identified one if it has none)."""
        if event == "MESSAGE_CREATE":  # so channel history knows it, as Discord would
            self.messages.setdefault(int(data["id"]), data)
        guild = data.get("guild_id")
        for socket in list(self.sockets):
            if self.owns(socket, int(guild) if guild is not None else None) or (guild is None and event != "MESSAGE_CREATE"):
                await socket.send_json({"op": 0, "t": event, "s": next(self._sequence), "d": data})


# --- interaction payloads ----------------------------------------------------------------------------


@dataclass
class Person:
    id: int
    name: str
    permissions: int = MEMBER_PERMISSIONS

    @property
    def user(self) -> dict[str, Any]:
        return user_payload(self.id, self.name)


def _base_interaction(
    kind: int, person: Person, *, guild_id: int | None, channel_id: int, data: dict[str, Any]
) -> dict[str, Any]:
    interaction_id = snowflake()
    payload: dict[str, Any] = {
        "id": str(interaction_id), "application_id": str(BOT_ID), "type": kind, "token": f"token-{interaction_id}",
        "version": 1, "locale": "en-US", "data": data, "entitlements": [], "app_permissions": str(ADMIN_PERMISSIONS),
        "attachment_size_limit": 10 * 1024 * 1024,
    }
    if guild_id is not None:
        payload.update(guild_id=str(guild_id), guild_locale="en-US", context=0,
                       authorizing_integration_owners={"0": str(guild_id)})
        payload["channel_id"] = str(channel_id)
        payload["channel"] = {"id": str(channel_id), "type": 0, "guild_id": str(guild_id), "name": "general",
                              "permissions": str(person.permissions)}
        payload["member"] = {"user": person.user, "roles": [], "joined_at": now_iso(), "deaf": False, "mute": False,
                             "flags": 0, "permissions": str(person.permissions)}
    else:
        payload.update(context=1, authorizing_integration_owners={"0": str(person.id)})
        payload["channel_id"] = str(channel_id)
        payload["channel"] = {"id": str(channel_id), "type": 1, "recipients": [person.user]}
        payload["user"] = person.user
    return payload


class SlashHarness:
    """Drives a logged-in `DeskmateBot` with interaction payloads, through discord.py's own dispatch."""

    def __init__(self, bot: discord.Client, fake: FakeDiscord) -> None:
        self.bot = bot
        self.fake = fake

    @property
    def tree(self) -> discord.app_commands.CommandTree:
        return self.bot.tree  # type: ignore[attr-defined]

    def _command(self, path: str) -> discord.app_commands.Command[Any, ..., Any]:
        names = path.split()
        found: Any = self.tree.get_command(names[0])
        for name in names[1:]:
            found = found.get_command(name)
        assert isinstance(found, discord.app_commands.Command), path
        return found

    def _options(
        self, path: str, values: dict[str, Any], focused: str | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Nested options for `path` ('personal memories add') with values typed from the real parameters."""
        command = self._command(path)
        resolved: dict[str, Any] = {}
        leaf: list[dict[str, Any]] = []
        for name, value in values.items():
            parameter = command._params[name]
            kind = parameter.type.value
            option: dict[str, Any] = {"name": name, "type": kind}
            if isinstance(value, dict) and "filename" in value:  # an attachment payload
                resolved.setdefault("attachments", {})[value["id"]] = value
                option["value"] = value["id"]
            elif isinstance(value, Person):
                resolved.setdefault("users", {})[str(value.id)] = value.user
                option["value"] = str(value.id)
            elif kind == discord.AppCommandOptionType.channel.value:
                resolved.setdefault("channels", {})[str(value)] = {"id": str(value), "type": 0, "name": "channel",
                                                                   "permissions": str(ADMIN_PERMISSIONS)}
                option["value"] = str(value)
            else:
                option["value"] = value
            if name == focused:
                option["focused"] = True
            leaf.append(option)
        names = path.split()
        options = leaf
        for depth, name in reversed(list(enumerate(names[1:], start=1))):
            is_leaf = depth == len(names) - 1
            options = [{"type": 1 if is_leaf else 2, "name": name, "options": options}]
        return options, resolved

    def slash(self, path: str, person: Person, *, guild_id: int | None = GUILD_ID, channel_id: int = GENERAL_ID,
              **values: Any) -> dict[str, Any]:
        options, resolved = self._options(path, values)
        data: dict[str, Any] = {"id": str(snowflake()), "name": path.split()[0], "type": 1, "options": options}
        if resolved:
            data["resolved"] = resolved
        return _base_interaction(2, person, guild_id=guild_id, channel_id=channel_id, data=data)

    def autocomplete(
        self, path: str, person: Person, focused: str, *, guild_id: int | None = GUILD_ID, **values: Any
    ) -> dict[str, Any]:
        options, _ = self._options(path, values, focused=focused)
        data = {"id": str(snowflake()), "name": path.split()[0], "type": 1, "options": options}
        return _base_interaction(4, person, guild_id=guild_id, channel_id=GENERAL_ID, data=data)

    def button(
        self, message: dict[str, Any], custom_id: str, person: Person, *, guild_id: int | None = GUILD_ID
    ) -> dict[str, Any]:
        data = {"custom_id": custom_id, "component_type": 2}
        payload = _base_interaction(3, person, guild_id=guild_id, channel_id=int(message["channel_id"]), data=data)
        payload["message"] = message
        return payload

    def modal_submit(self, modal: dict[str, Any], person: Person, values: dict[str, str], *,
                     guild_id: int | None = GUILD_ID) -> dict[str, Any]:
        """Fill the modal a callback (type 9) showed: `values` maps field labels to what the person typed."""
        rows = []
        for row in modal["components"]:
            for component in row["components"]:
                label = component.get("label", "")
                rows.append({"type": 1, "components": [
                    {"type": 4, "custom_id": component["custom_id"], "value": values.get(label, component.get("value") or "")}
                ]})
        data = {"custom_id": modal["custom_id"], "components": rows}
        return _base_interaction(5, person, guild_id=guild_id, channel_id=GENERAL_ID, data=data)

    async def run(self, payload: dict[str, Any], *, within: float = 20.0) -> Call:
        """Dispatch like the gateway does and return the first response (callback) to this interaction."""
        start = len(self.fake.calls)
        token = payload["token"]
        self.bot._connection.parse_interaction_create(payload)  # type: ignore[attr-defined]
        return await self.fake.wait_for(lambda call: token in call.path, within, after=start)

    async def next_call(self, payload: dict[str, Any], *, after: Call, within: float = 20.0) -> Call:
        """A later request for the same interaction (a followup or an edit after `defer`)."""
        token = payload["token"]
        index = self.fake.calls.index(after) + 1
        return await self.fake.wait_for(lambda call: token in call.path, within, after=index)

    def original_message(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.fake.messages[self.fake._originals[payload["token"]]]


@contextlib.asynccontextmanager
async def slash_harness(core: MemoryCore) -> AsyncIterator[SlashHarness]:
    """A `DeskmateBot` on `core` with a plain `ReplyPipeline`, logged in to a fresh `FakeDiscord` (the command tree
    synced, the test guild cached), as a `SlashHarness`; the bot is closed afterwards."""
    async with FakeDiscord() as fake:
        bot = DeskmateBot(build_services(core))
        await bot.login("fake-token")
        bot._connection._add_guild_from_data(guild_payload())
        try:
            yield SlashHarness(bot, fake)
        finally:
            await bot.close()


def custom_ids(message: dict[str, Any]) -> dict[str, str]:
    """Button label (or emoji name) -> custom_id, from a message's components."""
    found: dict[str, str] = {}
    for row in message.get("components") or []:
        for component in row.get("components", []):
            if component.get("type") == 2 and "custom_id" in component:
                key = component.get("label") or (component.get("emoji") or {}).get("name", "")
                found[key] = component["custom_id"]
    return found
