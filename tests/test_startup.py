"""Start-up failures a person can fix end with one sentence naming the setting, never a traceback.

Each case runs `python -m bot check` (it opens the database exactly as the bot does) in a real process
with the bad setting, and expects exit status != 0 and a single `error: ...` line on stderr that names
DATA_DIR, DATABASE_URL, DEV_GUILD_ID or SHARD_IDS. Ids go through one parser, `bot.ids.parse_id`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from bot.config import ConfigError, load_settings, redact_url, url_secrets
from bot.ids import MAX_ID, parse_id
from bot.redact import Redactor, secrets_of

ROOT = Path(__file__).resolve().parents[1]


def run_bot(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "DATA_DIR")}
    full = {**base, "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **env}
    return subprocess.run([sys.executable, "-m", "bot", "check"], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)


def one_sentence(done: subprocess.CompletedProcess[str], *names: str) -> str:
    """The only stderr line (Python's own warnings about XDG_RUNTIME_DIR aside), which must name the setting."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "XDG_RUNTIME_DIR" not in line
             and "user_runtime_dir" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert any(name in lines[0] for name in names), lines[0]
    return lines[0]


def test_no_warning_about_xdg_runtime_dir(tmp_path: Path) -> None:
    """Docker and service managers start the bot without a login session, so without XDG_RUNTIME_DIR: the embedded
    server's library used to warn about it on every command."""
    base = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "XDG_RUNTIME_DIR")}
    env = {**base, "DATA_DIR": str(tmp_path / "data"), "LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bot", "check"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a folder")
    line = one_sentence(run_bot({"DATA_DIR": str(tmp_path / "data")}, tmp_path), "DATA_DIR")
    assert "is a file" in line


def test_data_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    line = one_sentence(run_bot({"DATA_DIR": str(tmp_path / "file" / "data")}, tmp_path), "DATA_DIR")
    assert "which is a file" in line


def test_data_dir_that_is_read_only(tmp_path: Path) -> None:
    """Root writes through any permission bits, so as root DATA_DIR is a read-only file system (a tmpfs mounted ro)."""
    data = tmp_path / "data"
    data.mkdir()
    mounted = False
    if os.geteuid() == 0:
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(data)], capture_output=True,
                               text=True, check=False)
        if mount.returncode != 0:
            pytest.skip(f"running as root and cannot mount a read-only tmpfs: {mount.stderr.strip()}")
        mounted = True
    else:
        data.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = one_sentence(run_bot({"DATA_DIR": str(data)}, tmp_path), "DATA_DIR")
        assert "read-only" in line or "not writable" in line, line
    finally:
        if mounted:
            subprocess.run(["umount", str(data)], check=False)
        else:
            data.chmod(stat.S_IRWXU)


@pytest.mark.parametrize(("name", "value"), [
    ("DEV_GUILD_ID", "²"), ("DEV_GUILD_ID", "9" * 5000), ("DEV_GUILD_ID", "0"), ("SHARD_IDS", "²"), ("SHARD_IDS", "0-²"),
])
def test_ids_that_isdigit_accepts_and_int_refuses(name: str, value: str, tmp_path: Path) -> None:
    env = {name: value, "DATA_DIR": str(tmp_path / "data")}
    if name == "SHARD_IDS":
        env["SHARD_COUNT"] = "2"
    line = one_sentence(run_bot(env, tmp_path), name)
    assert len(line) < 300


@pytest.mark.parametrize("url", [
    "postgresql://u@127.0.0.1:99999/db",
    "postgresql://u@127.0.0.1:abc/db",
    "postgresql://u@127.0.0.1/db?sslmode=bogus",
    "postgresql://u@127.0.0.1/db?port=%C2%B2",
])
def test_database_urls_asyncpg_would_refuse_with_a_traceback(url: str, tmp_path: Path) -> None:
    one_sentence(run_bot({"DATABASE_URL": url}, tmp_path), "DATABASE_URL")


def test_an_unreachable_database_with_a_password_in_the_query_string(tmp_path: Path) -> None:
    url = "postgresql://u@127.0.0.1:1/db?password=hunter2secret&sslmode=disable"
    line = one_sentence(run_bot({"DATABASE_URL": url}, tmp_path), "DATABASE_URL")
    assert "hunter2secret" not in line and "password=***" in line


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:pw@host/db", "postgresql://u:***@host/db"),
    ("postgresql://u@host/db?password=secret", "postgresql://u@host/db?password=***"),
    ("postgresql://u@host/db?PassWord=s1&sslmode=require", "postgresql://u@host/db?PassWord=***&sslmode=require"),
    ("postgresql://u@host/db?sslpassword=s2&passfile=/p&api_key=s3&key=s4&token=s5&secret=s6",
     "postgresql://u@host/db?sslpassword=***&passfile=***&api_key=***&key=***&token=***&secret=***"),
    ("postgresql://u@host/db?db_password=s7&auth-token=s8&application_name=bot",
     "postgresql://u@host/db?db_password=***&auth-token=***&application_name=bot"),
    ("postgresql://u:p%40ss@[::1:5432/db?Secret=x", "postgresql://u:***@[::1:5432/db?Secret=***"),
    ("postgresql://host/db", "postgresql://host/db"),
])
def test_redact_url_knows_every_place_a_secret_can_sit(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_secrets_in_the_query_string_are_masked_in_every_log_line() -> None:
    url = "postgresql://u:first%2Bpw@host/db?password=second-pw&sslpassword=third+pw"
    settings = load_settings({"DATABASE_URL": url}, dotenv_path=None)
    assert {"first+pw", "first%2Bpw", "second-pw", "third+pw", "third pw"} <= set(url_secrets(url))
    redactor = Redactor(secrets_of(settings))
    text = redactor("could not connect with second-pw, first+pw and third pw")
    assert "second-pw" not in text and "first+pw" not in text and "third pw" not in text


@pytest.mark.parametrize(("value", "expected"), [
    (1, 1), ("42", 42), ("  42\n", 42), (MAX_ID, MAX_ID), (str(MAX_ID), MAX_ID), ("00000000000000000001", 1),
])
def test_parse_id_accepts(value: object, expected: int) -> None:
    assert parse_id(value, "the id") == expected


@pytest.mark.parametrize("value", [
    True, False, 0, -1, MAX_ID + 1, 10**5000, "0", "-1", "+1", "²", "①", "٣", "1_000", "1.0", "", " ", "1 2",
    "9" * 21, "9" * 5000, str(MAX_ID + 1), None, 1.0, b"12", [1],
], ids=lambda value: f"{type(value).__name__}-{value.bit_length() if isinstance(value, int) else len(str(value)[:9])}")
def test_parse_id_refuses_with_a_short_sentence(value: object) -> None:
    with pytest.raises(ValueError, match=r"^the id must") as refused:
        parse_id(value, "the id")
    assert len(str(refused.value)) < 120


def test_shard_numbers_start_at_zero() -> None:
    assert parse_id("0", "SHARD_IDS", minimum=0) == 0
    settings = load_settings({"SHARD_COUNT": "4", "SHARD_IDS": "0-1, 3"}, dotenv_path=None)
    assert settings.shard_ids == (0, 1, 3)


@pytest.mark.parametrize("password", ["p@ss/w:rd#1 %x", "100%", "a?b&c=d", "ünïcødé"])
async def test_database_password_is_used_as_written(password: str, pg_server_url: str, tmp_path: Path) -> None:
    """docker-compose.yml used to paste POSTGRES_PASSWORD into DATABASE_URL: `@`, `/`, `#` or `%` broke the URL.
    DATABASE_PASSWORD is taken as written: a role with that password logs in over TCP with password auth."""
    import asyncpg

    role = f"deskmate_pw_{abs(hash(password)) % 10**8}"
    admin = await asyncpg.connect(pg_server_url)
    try:
        host = await admin.fetchval("SELECT inet_server_addr()")
        port = await admin.fetchval("SELECT current_setting('port')")
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password.replace(chr(39), chr(39) * 2)}'")
        settings = load_settings({"DATABASE_URL": f"postgresql://{role}@127.0.0.1:{port}/postgres",
                                  "DATABASE_PASSWORD": password}, dotenv_path=None)
        assert f":{quote(password, safe='')}@" in (settings.database_url or "")  # URL-encoded in the URL
        assert secrets_of(settings) and password in secrets_of(settings)  # and masked wherever it shows up as written
        if host is None:  # the test server listens on a Unix socket only: check how asyncpg reads the URL
            from asyncpg.connect_utils import _parse_connect_dsn_and_args

            params = _parse_connect_dsn_and_args(
                dsn=settings.database_url, host=None, port=None, user=None, password=None, passfile=None, database=None,
                ssl=None, direct_tls=None, server_settings=None, target_session_attrs=None, krbsrvname=None, gsslib=None,
                service=None, servicefile=None)[1]
            assert (params.user, params.password) == (role, password)
        else:
            connection = await asyncpg.connect(settings.database_url)
            assert await connection.fetchval("SELECT current_user") == role
            await connection.close()
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


def test_database_password_in_one_place_only() -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL has a password too"):
        load_settings({"DATABASE_URL": "postgresql://u:one@h/db", "DATABASE_PASSWORD": "two"}, dotenv_path=None)
    with pytest.raises(ConfigError, match="DATABASE_URL is not"):
        load_settings({"DATABASE_PASSWORD": "two"}, dotenv_path=None)
    same = load_settings({"DATABASE_URL": "postgresql://u@h/db?sslmode=disable", "DATABASE_PASSWORD": ""}, dotenv_path=None)
    assert same.database_url == "postgresql://u@h/db?sslmode=disable"
    assert load_settings({"DATABASE_URL": "postgresql://u:@h/db", "DATABASE_PASSWORD": "a b"},
                         dotenv_path=None).database_url == "postgresql://u:a%20b@h/db"


def test_a_published_default_password_never_masks_the_bots_name() -> None:
    """The old compose default was "deskmate": masking it turned "Connected as deskmate" into "Connected as ***" and
    told every reader of the log the password anyway. A real password is still masked."""
    public = Redactor(secrets_of(load_settings({"DATABASE_URL": "postgresql://deskmate:deskmate@db/deskmate"},
                                               dotenv_path=None)))
    assert public("Connected as deskmate (id 1)") == "Connected as deskmate (id 1)"
    private = Redactor(secrets_of(load_settings({"DATABASE_URL": "postgresql://deskmate@db/deskmate",
                                                 "DATABASE_PASSWORD": "s3cret-pw"}, dotenv_path=None)))
    assert private("login with s3cret-pw failed") == "login with *** failed"


@pytest.mark.skipif(not Path("/proc").is_mount(), reason="needs a mount point to stand for the image's volume")
def test_a_data_dir_off_the_images_volume_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """In the image, /data is a volume; an .env saying DATA_DIR=./data would keep everything in the container."""
    from bot.__main__ import _warn_if_lost_with_the_container

    _warn_if_lost_with_the_container(tmp_path / "data", volume=Path("/proc"))  # /proc stands for the mounted /data
    warned = capsys.readouterr().err
    assert warned.startswith("warning: DATA_DIR") and "lost with the container" in warned and warned[-1] == "\n"
    for quiet in ((Path("/proc/data"), Path("/proc")), (tmp_path / "data", tmp_path)):  # on the volume; no volume
        _warn_if_lost_with_the_container(*quiet)
        assert capsys.readouterr().err == ""
