"""The schema contract: which Awa schema versions and storage engines
awa_trio can maintain, and the ``migrate`` command (delegated to awa-pg)."""

from __future__ import annotations

import dataclasses
import logging

from .db import Database
from .errors import UnsupportedSchema

log = logging.getLogger(__name__)

#: Awa 0.6.0-0.6.1 = 39, Awa 0.6.2-0.6.9 = 40 (v40 only changes storage-transition finalisation).
SUPPORTED_SCHEMA_VERSIONS = (39, 40)
CANONICAL = "canonical"
QUEUE_STORAGE = "queue_storage"
#: Engines with a full set of branches in this release.
SUPPORTED_ENGINES = (CANONICAL,)
AWA_PG_REQUIREMENT = "awa-pg==0.6.1"

_SCHEMA_PRESENT_SQL = "SELECT to_regclass('awa.schema_version') IS NOT NULL"
_SCHEMA_VERSION_SQL = "SELECT max(version) FROM awa.schema_version"
_ACTIVE_ENGINE_SQL = "SELECT awa.active_storage_engine()"


@dataclasses.dataclass(frozen=True)
class SchemaInfo:
    version: int
    engine: str


def unsupported_version_message(version: int | None) -> str:
    supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
    if version is None:
        return (
            "no awa schema in this database (supported versions: "
            f"{supported}); install it with `python -m awa_trio migrate`"
        )
    return (
        f"awa schema version {version} is not supported (supported: {supported}); "
        f"upgrade awa_trio or pin awa-pg"
    )


async def read_schema(db: Database) -> SchemaInfo | None:
    """The installed schema version and active engine, or None without an awa schema."""
    if not await db.fetchval(_SCHEMA_PRESENT_SQL):
        return None
    version = await db.fetchval(_SCHEMA_VERSION_SQL)
    if version is None:
        return None
    engine = await db.fetchval(_ACTIVE_ENGINE_SQL)
    return SchemaInfo(version=int(version), engine=str(engine))


async def check_schema(db: Database) -> SchemaInfo:
    """Refuse, with one clear line, any database awa_trio cannot maintain."""
    info = await read_schema(db)
    if info is None:
        raise UnsupportedSchema(unsupported_version_message(None))
    if info.version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchema(unsupported_version_message(info.version))
    if info.engine not in SUPPORTED_ENGINES:
        raise UnsupportedSchema(unsupported_engine_message(info.engine))
    return info


def unsupported_engine_message(engine: str) -> str:
    return (
        f"awa storage engine {engine!r} is not maintained by this awa_trio release "
        f"(supported: {', '.join(SUPPORTED_ENGINES)}); let an Awa runtime lead this database"
    )


def migrate(database_url: str) -> int:
    """Install or upgrade the Awa schema with awa-pg's own migrator."""
    try:
        import awa  # type: ignore[import-not-found]
    except ImportError:
        raise UnsupportedSchema(
            f"awa-pg is not installed; install it with: pip install '{AWA_PG_REQUIREMENT}'"
        ) from None
    awa.Client(database_url).migrate()
    return 0
