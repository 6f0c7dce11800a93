"""Helpers for takeover, driver-error and chaos tests: backends by
application name, snapshot sampling, and awa_trio processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager

import trio

BACKENDS_SQL = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE $1 AND pid <> pg_backend_pid()
"""
TERMINATE_SQL = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid"


async def backend_pids(db, application_name_like: str) -> list[int]:
    """Backends of this database whose application_name matches (LIKE)."""
    return [row["pid"] for row in await db.fetch(BACKENDS_SQL, application_name_like)]


async def terminate_backends(db, pids: list[int]) -> int:
    """pg_terminate_backend each pid, in one statement; how many were signalled."""
    if not pids:
        return 0
    return await db.fetchval(TERMINATE_SQL, pids)
