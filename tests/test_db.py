"""Migrations: numbering rules, recorded versions, and a clear error when pgvector is missing."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from bot.db import DatabaseError, apply_migrations, migration_files, with_database


def test_with_database_keeps_host_and_query() -> None:
    assert with_database("postgresql://u:p@h:5/postgres?host=/tmp/s", "x") == "postgresql://u:p@h:5/x?host=/tmp/s"
    assert with_database("postgresql://h/postgres", "deskmate") == "postgresql://h/deskmate"


def test_migration_files_are_numbered_without_gaps(tmp_path: Path) -> None:
    assert [version for version, _, _ in migration_files()][:1] == [1]
    (tmp_path / "001_a.sql").write_text("SELECT 1;")
    (tmp_path / "003_c.sql").write_text("SELECT 1;")
    with pytest.raises(DatabaseError, match="without gaps"):
        migration_files(tmp_path)
    (tmp_path / "2_b.sql").write_text("SELECT 1;")
    with pytest.raises(DatabaseError, match="must be named"):
        migration_files(tmp_path)


async def test_migrations_are_recorded_and_not_applied_twice(db_url: str) -> None:
    assert await apply_migrations(db_url) == []  # the template was migrated already
    connection = await asyncpg.connect(db_url)
    try:
        versions = [row["version"] for row in await connection.fetch("SELECT version FROM schema_migrations ORDER BY 1")]
    finally:
        await connection.close()
    assert versions == [version for version, _, _ in migration_files()]


async def test_a_server_without_pgvector_gets_a_clear_message(pg_server_url: str, tmp_path: Path) -> None:
    from bot.db import drop_database, ensure_database

    (tmp_path / "001_vector.sql").write_text("CREATE EXTENSION IF NOT EXISTS vector_that_is_not_installed;")
    await ensure_database(pg_server_url, "t_no_vector")
    try:
        with pytest.raises(DatabaseError, match="pgvector/pgvector Docker image"):
            await apply_migrations(with_database(pg_server_url, "t_no_vector"), tmp_path)
    finally:
        await drop_database(pg_server_url, "t_no_vector")


async def test_a_failed_migration_changes_nothing(pg_server_url: str, tmp_path: Path) -> None:
    from bot.db import drop_database, ensure_database

    (tmp_path / "001_ok.sql").write_text("CREATE TABLE first_table (id int);")
    (tmp_path / "002_broken.sql").write_text("CREATE TABLE second_table (id int); SELECT no_such_function();")
    await ensure_database(pg_server_url, "t_broken_migration")
    url = with_database(pg_server_url, "t_broken_migration")
    try:
        with pytest.raises(asyncpg.PostgresError):
            await apply_migrations(url, tmp_path)
        connection = await asyncpg.connect(url)
        try:
            tables = {row["tablename"] for row in await connection.fetch("SELECT tablename FROM pg_tables")}
            versions = [row["version"] for row in await connection.fetch("SELECT version FROM schema_migrations")]
        finally:
            await connection.close()
        assert "first_table" in tables and "second_table" not in tables and versions == [1]
    finally:
        await drop_database(pg_server_url, "t_broken_migration")
