"""Chat: Discord messages in, `ReplyPipeline` replies and memory notices out (SPEC §5, §6).

Every message the bot can read is recorded as it arrives (the context window); messages that
trigger a reply (mention, reply to the bot, DM, persona name, auto-reply channel) are answered
with a typing indicator and a reply reference. Replies may ping their author and nobody else:
memory texts are written by anyone, so they must never turn into @everyone, role or user pings.
One bad message is logged and skipped; it never stops the listener.
"""

from __future__ import annotations

import logging

import discord
from discord.ext import commands

from bot.pipeline import IncomingMessage, Notices, ReplyOutcome, ReplyPipeline, ReplyStatus, UserRef

log = logging.getLogger(__name__)

CHAT_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_MODEL_TEXT = (
    "I have no chat model configured yet, so I cannot answer. Whoever runs me needs to set CHAT_MODEL and "
    "CHAT_BASE_URL (or CHAT_API_KEY) and restart me."
)
NOTICE_MENTIONS = discord.AllowedMentions.none()


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
        is_bot=message.author.bot,
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

    @property
    def pipeline(self) -> ReplyPipeline | None:
        return getattr(self.bot, "pipeline", None)

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        pipeline = self.pipeline
        me = self.bot.user
        if pipeline is None or me is None or message.type not in CHAT_TYPES:
            return
        try:
            await self.handle(pipeline, message, me.id)
        except Exception:
            log.exception("Failed to handle message %s in channel %s", message.id, message.channel.id)

    async def handle(self, pipeline: ReplyPipeline, message: discord.Message, my_id: int) -> None:
        incoming = to_incoming(message)
        if message.author.id != my_id and await pipeline.needs_history(incoming.channel_id):
            await self.backfill(pipeline, message)
        await pipeline.record_message(incoming)
        trigger = await pipeline.trigger(
            incoming,
            mentions_bot=any(user.id == my_id for user in message.mentions),
            replies_to_bot=replies_to(message, my_id),
        )
        if trigger is None:
            return
        log.debug("Answering message %s (%s)", message.id, trigger.value)
        async with message.channel.typing():
            outcome = await pipeline.reply(incoming)
        await self.send_reply(message, outcome)
        await self.send_notices(message, outcome.notices)

    async def backfill(self, pipeline: ReplyPipeline, message: discord.Message) -> None:
        """First message the bot sees in a channel: read the recent history once, so the window is not empty."""
        limit = max(0, pipeline.settings.context_messages - 1)
        if not limit:
            return
        try:
            older = [to_incoming(m) async for m in message.channel.history(limit=limit, before=message) if m.type in CHAT_TYPES]
        except discord.HTTPException as exc:  # no Read Message History permission, for instance
            log.info("Cannot read the history of channel %s: %s", message.channel.id, exc)
            return
        await pipeline.record_history(list(reversed(older)))

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
            if number == 0:
                await message.reply(chunk, allowed_mentions=ping_author, mention_author=True)
            else:
                await message.channel.send(chunk, allowed_mentions=ping_author)

    async def send_notices(self, message: discord.Message, notices: Notices | None) -> None:
        if notices is None or notices.destination == "hidden" or not notices.lines:
            return
        channel: discord.abc.Messageable | None = message.channel
        if notices.destination == "log":
            found = self.bot.get_channel(notices.log_channel_id) if notices.log_channel_id else None
            channel = found if isinstance(found, discord.abc.Messageable) else None
            if channel is None:
                log.warning("Log channel %s for memory notices is not reachable", notices.log_channel_id)
                return
        for chunk in notices.chunks:
            try:
                await channel.send(chunk, allowed_mentions=NOTICE_MENTIONS, silent=True)
            except discord.HTTPException as exc:
                log.warning("Could not post a memory notice in %s: %s", getattr(channel, "id", "?"), exc)
                return

    # --- keep the stored context window in step with Discord ---

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        pipeline = self.pipeline
        content = payload.data.get("content")
        if pipeline is None or content is None:
            return
        edited = payload.data.get("edited_timestamp")
        when = discord.utils.parse_time(edited) if edited else discord.utils.utcnow()
        try:
            await pipeline.edit_message(payload.channel_id, payload.message_id, content, when)
        except Exception:
            log.exception("Failed to record an edit of message %s", payload.message_id)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        if self.pipeline is not None:
            await self.pipeline.delete_messages(payload.channel_id, [payload.message_id])

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        if self.pipeline is not None:
            await self.pipeline.delete_messages(payload.channel_id, sorted(payload.message_ids))

    @commands.Cog.listener()
    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        if self.pipeline is not None:
            await self.pipeline.forget_channel(channel.id)

    @commands.Cog.listener()
    async def on_raw_thread_delete(self, payload: discord.RawThreadDeleteEvent) -> None:
        if self.pipeline is not None:
            await self.pipeline.forget_channel(payload.thread_id)


async def setup(bot: commands.Bot) -> None:
    await bot.add_cog(Chat(bot))
