"""Versioned schema migrations: numbered SQL files applied once each, in order, recorded in a table.

A file's checksum is recorded with it so an edited, already-applied migration is reported instead
of silently diverging between installations. The same SQL runs on chDB and on a ClickHouse server.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

MIGRATIONS_PACKAGE = "entroloop.infra.clickhouse.migrations"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def statements(self, database: str) -> list[str]:
        body = "\n".join(line for line in self.sql.splitlines() if not line.lstrip().startswith("--"))
        return [s.strip().replace("{db}", database) for s in body.split(";") if s.strip()]


class MigrationError(RuntimeError):
    pass


def available_migrations() -> list[Migration]:
    found = []
    for entry in resources.files(MIGRATIONS_PACKAGE).iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def applied_migrations(client: Any, database: str) -> dict[int, str]:
    rows = client.query(f"SELECT version, checksum FROM {database}.schema_migrations").result_rows
    return {int(v): c for v, c in rows}


def migrate(client: Any, database: str) -> list[Migration]:
    """Apply every migration not yet applied; return those applied now."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations "
        "(version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY version"
    )
    done = applied_migrations(client, database)
    applied = []
    for migration in available_migrations():
        if migration.version in done:
            if done[migration.version] != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} was edited after it was applied; "
                    "add a new migration instead of changing an applied one"
                )
            continue
        for statement in migration.statements(database):
            client.command(statement)
        client.insert(
            f"{database}.schema_migrations",
            [[migration.version, migration.name, migration.checksum]],
            column_names=["version", "name", "checksum"],
        )
        applied.append(migration)
    return applied
