"""Chat: Discord messages in, `ReplyPipeline` replies and memory notices out.

Every message the bot can read is recorded as it arrives (the context window); messages that
trigger a reply (mention, reply to the bot, DM, persona name, auto-reply channel) are answered
with a typing indicator and a reply reference. Replies may ping their author and nobody else:
memory texts are written by anyone, so they must never turn into @everyone, role or user pings.
One bad message is logged and skipped; it never stops the listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator

import discord
from discord.ext import commands

from bot.chat.messages import IncomingMessage, UserRef
from bot.chat.notices import Notices
from bot.chat.receipts import ReplyStatus
from bot.chat.reply import ReplyOutcome
from bot.services import Services

log = logging.getLogger(__name__)

CHAT_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_MODEL_TEXT = (
    "I have no chat model configured yet, so I cannot answer. Whoever runs me needs to set CHAT_MODEL and "
    "CHAT_BASE_URL (or CHAT_API_KEY) and restart me."
)
NOTICE_MENTIONS = discord.AllowedMentions.none()
# A send Discord refused: an HTTP error, or a 429 asking to wait longer than MAX_RATELIMIT_WAIT_S (not an HTTPException).
SEND_ERRORS = (discord.HTTPException, discord.RateLimited)
TYPING_REFRESH_S = 8.0  # Discord shows "is typing…" for 10 seconds after each request
# What answering in a channel takes: see it, write in it (threads have their own permission), and read its
# history (a reply references the message it answers, which Discord refuses without Read Message History).
REPLY_PERMISSIONS = ("view_channel", "send_messages", "read_message_history")
THREAD_REPLY_PERMISSIONS = ("view_channel", "send_messages_in_threads", "read_message_history")


def permission_name(flag: str) -> str:
    return flag.replace("_", " ").title().replace("In Threads", "in Threads")


def missing_permissions(channel: discord.abc.Messageable) -> list[str]:
    """The reply permissions the bot lacks in `channel` as far as the cache knows (may be empty when it cannot tell)."""
    guild = getattr(channel, "guild", None)
    me = guild.me if guild is not None else None
    if me is None or not hasattr(channel, "permissions_for"):
        return []
    wanted = THREAD_REPLY_PERMISSIONS if isinstance(channel, discord.Thread) else REPLY_PERMISSIONS
    have = channel.permissions_for(me)
    return [permission_name(flag) for flag in wanted if not getattr(have, flag)]


def missing_permission_report(channel: discord.abc.Messageable, error: discord.HTTPException) -> str:
    """The one message an admin gets in the log channel when the bot cannot answer somewhere."""
    place = getattr(channel, "mention", f"channel {getattr(channel, 'id', '?')}")
    missing = missing_permissions(channel)
    if missing:
        needed = ", ".join(missing)
        what = f"I'm missing {needed} there"
    else:
        needed = ", ".join(permission_name(flag) for flag in REPLY_PERMISSIONS)
        what = f"Discord refused my message ({error.status}, code {error.code}: {error.text or 'Missing Permissions'})"
    return (
        f"⚠️ I can't answer in {place}: {what}. To let me answer there, give me {needed} in that channel "
        "(or its category). I report this once; I'll report it again only if it happens after I could answer there."
    )


def message_text(message: discord.Message) -> str:
    """What the model reads: mentions as @names (`clean_content`), plus a line per attachment."""
    text = message.clean_content
    extras = [f"[attachment: {attachment.filename}]" for attachment in message.attachments]
    if message.stickers:
        extras += [f"[sticker: {sticker.name}]" for sticker in message.stickers]
    return "\n".join([text, *extras]).strip()


def where_of(channel: discord.abc.Messageable) -> str:
    if isinstance(channel, discord.DMChannel):
        return "a direct message"
    name = getattr(channel, "name", None)
    guild = getattr(channel, "guild", None)
    place = f"#{name}" if name else "a channel"
    if isinstance(channel, discord.Thread) and channel.parent is not None:
        place = f'the thread "{name}" in #{channel.parent.name}'
    return f'{place} in "{guild.name}"' if guild is not None else place


def to_incoming(message: discord.Message) -> IncomingMessage:
    """A discord.Message as the pipeline's plain value (a thread's memory channel is its parent)."""
    channel = message.channel
    parent_id = channel.parent_id if isinstance(channel, discord.Thread) else None
    private = isinstance(channel, discord.Thread) and channel.type == discord.ChannelType.private_thread
    reference = message.reference
    return IncomingMessage(
        message_id=message.id,
        channel_id=channel.id,
        author_id=message.author.id,
        author_name=message.author.display_name,
        text=message_text(message),
        created_at=message.created_at,
        guild_id=message.guild.id if message.guild is not None else None,
        parent_channel_id=parent_id,
        private_thread=private,
        is_bot=message.author.bot,
        author_can_manage=isinstance(message.author, discord.Member) and message.author.guild_permissions.manage_guild,
        reply_to=reference.message_id if reference is not None else None,
        mentions=tuple(UserRef(user.id, user.display_name, user.bot) for user in message.mentions),
        where=where_of(channel),
    )


def replies_to(message: discord.Message, user_id: int) -> bool:
    resolved = message.reference.resolved if message.reference is not None else None
    return isinstance(resolved, discord.Message) and resolved.author.id == user_id


class Chat(commands.Cog):
    def __init__(self, bot: commands.Bot) -> None:
        self.bot = bot
        # Channels where sending was refused for lack of permissions, reported once until a send there works again.
        self.refused_channels: set[int] = set()

    async def cog_load(self) -> None:
        services = getattr(self.bot, "services", None)  # the command reference loads the cogs without services
        if services is not None:
            services.summaries.notes.listener = self.post_day_notes  # the day-end notes' one notice per day

    async def post_day_notes(self, channel_id: int, guild_id: int | None, notices: Notices) -> None:
        """A chat day's notes notice, in that channel or the log channel, as the server's notice settings say."""
        channel = self.bot.get_channel(channel_id)
        if isinstance(channel, discord.abc.Messageable):
            await self.send_notices_in(channel, notices)
        else:
            log.warning("Channel %s of a day-end notes notice is not reachable", channel_id)

    @property
    def services(self) -> Services:
        return self.bot.services  # type: ignore[attr-defined]

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        me = self.bot.user
        if me is None or message.type not in CHAT_TYPES:
            return
        try:
            await self.handle(message, me.id)
        except Exception:
            log.exception("Failed to handle message %s in channel %s", message.id, message.channel.id)

    async def handle(self, message: discord.Message, my_id: int) -> None:
        """One call to the chat service per message; the outcome becomes the reply and the notices."""

        async def older(limit: int) -> list[IncomingMessage]:
            """The channel's recent history, the first time the bot sees the channel."""
            try:
                history = message.channel.history(limit=limit, before=message)
                found = [to_incoming(m) async for m in history if m.type in CHAT_TYPES]
            except discord.HTTPException as exc:  # no Read Message History permission, for instance
                log.info("Cannot read the history of channel %s: %s", message.channel.id, exc)
                return []
            return list(reversed(found))

        outcome = await self.services.chat.handle(
            to_incoming(message),
            mentions_bot=any(user.id == my_id for user in message.mentions),
            replies_to_bot=replies_to(message, my_id),
            older=older,
            while_replying=lambda: self.typing(message.channel),
        )
        if outcome is None:
            return
        await self.send_reply(message, outcome)
        await self.send_notices(message, outcome.notices)

    async def send_reply(self, message: discord.Message, outcome: ReplyOutcome) -> None:
        chunks = outcome.chunks
        if outcome.status == ReplyStatus.NO_MODEL:
            log.info("No chat model configured; this is what the reply would have used:\n%s", outcome.text)
            chunks = [NO_MODEL_TEXT]
        if outcome.error:
            log.warning("Reply to message %s failed: %s", message.id, outcome.error)
        ping_author = discord.AllowedMentions(everyone=False, roles=False, users=[message.author], replied_user=True)
        for number, chunk in enumerate(chunks):
            if not chunk.strip():
                continue
            try:
                if number == 0:
                    sent = await message.reply(chunk, allowed_mentions=ping_author, mention_author=True)
                else:
                    sent = await message.channel.send(chunk, allowed_mentions=ping_author)
            except SEND_ERRORS as exc:  # the rest of this reply would fail the same way: stop here
                await self.send_failed(message.channel, exc, f"reply to message {message.id}")
                return
            if number > 0:  # only the first part references the message it answers; the log must know for every part
                await self.record_part(sent, message.id)
        self.refused_channels.discard(message.channel.id)

    async def record_part(self, sent: discord.Message, answered_id: int) -> None:
        """A later part of a long reply, stored as answering the message (so delete-my-data and summaries find it)."""
        try:
            await self.services.chat.record(dataclasses.replace(to_incoming(sent), reply_to=answered_id))
        except Exception:
            log.exception("Could not record part %s of the reply to message %s", sent.id, answered_id)

    @contextlib.asynccontextmanager
    async def typing(self, channel: discord.abc.Messageable) -> AsyncIterator[None]:
        """"is typing…" while the reply is prepared, from a side task: a typing request that fails or is
        retried (discord.py retries 5xx answers for up to 25 s) never delays or stops the reply itself."""

        async def keep_typing() -> None:
            try:
                while True:
                    await channel.typing()
                    await asyncio.sleep(TYPING_REFRESH_S)
            except discord.HTTPException as exc:
                log.debug("No typing indicator in channel %s: %s", getattr(channel, "id", "?"), exc)

        task = asyncio.create_task(keep_typing(), name="typing")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def send_failed(self, channel: discord.abc.Messageable, error: discord.DiscordException, what: str) -> None:
        """A send Discord refused, after discord.py's own bounded retries (429s within MAX_RATELIMIT_WAIT_S, 5xx
        up to 5 tries): logged and never retried here. A missing permission in a server is also reported once
        to the server's log channel, so an admin learns why the bot stays silent there."""
        channel_id = getattr(channel, "id", 0)
        guild = getattr(channel, "guild", None)
        if not isinstance(error, discord.Forbidden) or guild is None:
            log.warning("Could not %s in channel %s: %s", what, channel_id, error)
            return
        first = channel_id not in self.refused_channels
        self.refused_channels.add(channel_id)
        log.log(
            logging.WARNING if first else logging.INFO,
            "Could not %s in channel %s of server %s, missing permissions: %s",
            what,
            channel_id,
            guild.id,
            error,
        )
        if first:
            await self.report_refusal(channel, guild, error)

    async def report_refusal(self, channel: discord.abc.Messageable, guild: discord.Guild, error: discord.HTTPException) -> None:
        settings = await self.services.servers.guild_settings(guild.id)
        log_channel_id = settings.log_channel_id
        if log_channel_id is None or log_channel_id == getattr(channel, "id", None):
            return
        target = self.bot.get_channel(log_channel_id)
        if not isinstance(target, discord.abc.Messageable):
            log.warning("Log channel %s of server %s is not reachable for a permission report", log_channel_id, guild.id)
            return
        try:
            await target.send(missing_permission_report(channel, error), allowed_mentions=NOTICE_MENTIONS)
        except discord.HTTPException as exc:
            log.warning("Could not report missing permissions in log channel %s: %s", log_channel_id, exc)

    async def send_notices(self, message: discord.Message, notices: Notices | None) -> None:
        if notices is not None:
            await self.send_notices_in(message.channel, notices)

    async def send_notices_in(self, where: discord.abc.Messageable, notices: Notices) -> None:
        if notices.destination == "hidden" or not notices.lines:
            return
        channel: discord.abc.Messageable | None = where
        if notices.destination == "log":
            found = self.bot.get_channel(notices.log_channel_id) if notices.log_channel_id else None
            channel = found if isinstance(found, discord.abc.Messageable) else None
            if channel is None:
                log.warning("Log channel %s for memory notices is not reachable", notices.log_channel_id)
                return
        for chunk in notices.chunks:
            try:
                await channel.send(chunk, allowed_mentions=NOTICE_MENTIONS, silent=True)
            except SEND_ERRORS as exc:
                await self.send_failed(channel, exc, "post a memory notice")
                return

    # --- keep the stored context window in step with Discord ---

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        content = payload.data.get("content")
        if content is None:
            return
        edited = payload.data.get("edited_timestamp")
        when = discord.utils.parse_time(edited) if edited else discord.utils.utcnow()
        try:
            await self.services.chat.edited(payload.channel_id, payload.message_id, content, when)
        except Exception:
            log.exception("Failed to record an edit of message %s", payload.message_id)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self.services.chat.deleted(payload.channel_id, [payload.message_id])

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self.services.chat.deleted(payload.channel_id, sorted(payload.message_ids))

    @commands.Cog.listener()
    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        await self.services.forget_channel(channel.id)

    @commands.Cog.listener()
    async def on_raw_thread_delete(self, payload: discord.RawThreadDeleteEvent) -> None:
        await self.services.forget_channel(payload.thread_id)

    @commands.Cog.listener()
    async def on_guild_remove(self, guild: discord.Guild) -> None:
        """Left or removed from a server: its stored messages and history chunks go (memories and documents stay)."""
        counts = await self.services.forget_guild(guild.id)
        log.info("Left server %s: forgot %s", guild.id, counts)


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Chat(bot))
