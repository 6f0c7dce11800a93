"""The private driver internals awa_trio's bridge (awa_trio/db/) relies on.

pyproject.toml caps asyncpg and trio-asyncio at the minor versions tested;
these tests are what to run before lifting a cap: each fails by name when an
internal the bridge reads has moved or changed meaning."""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import asyncpg
import trio
import trio_asyncio
from packaging.requirements import Requirement
from packaging.version import Version

from awa_trio import db as bridge


def _declared_requirement(name: str) -> Requirement:
    from importlib.metadata import requires

    for line in requires("awa-trio") or ():
        requirement = Requirement(line)
        if requirement.name == name and requirement.marker is None:
            return requirement
    raise AssertionError(f"awa-trio declares no requirement on {name}")


def test_installed_driver_versions_are_inside_the_tested_caps():
    for name in ("asyncpg", "trio-asyncio"):
        requirement = _declared_requirement(name)
        assert any(spec.operator == "<" for spec in requirement.specifier), f"{name} has no upper bound"
        assert Version(version(name)) in requirement.specifier, (name, version(name), requirement)


async def test_asyncpg_connection_internals_the_bridge_reads(database_url):
    """``Connection._protocol._is_cancelling()`` decides whether a statement
    may be driven directly; ``Connection._addr`` names the host that answered
    a multi-host URL."""
    async with trio_asyncio.open_loop():
        raw = await trio_asyncio.aio_as_trio(asyncpg.connect)(database_url)
        try:
            assert hasattr(raw, "_protocol"), "asyncpg.Connection._protocol is gone"
            assert callable(getattr(raw._protocol, "_is_cancelling", None)), (
                "asyncpg protocol._is_cancelling() is gone"
            )
            assert raw._protocol._is_cancelling() is False
            address = raw._addr
            assert isinstance(address, tuple) and len(address) >= 2, (
                f"asyncpg Connection._addr is {address!r}"
            )
            assert isinstance(address[1], int)
        finally:
            await trio_asyncio.aio_as_trio(raw.close)()


async def test_trio_asyncio_schedules_future_callbacks_through_call_soon():
    """_run_wakes_inline replaces the loop's ``call_soon``: a settled
    future's callbacks must go through it, and a callback marked
    ``runs_inline`` must run inside ``set_result`` itself."""
    async with trio_asyncio.open_loop() as loop:
        assert isinstance(loop, trio_asyncio.TrioEventLoop)
        bridge._run_wakes_inline(loop)
        ran: list[str] = []

        def wake(_future: asyncio.Future[None]) -> None:
            ran.append("inline")

        wake.runs_inline = True  # type: ignore[attr-defined]
        future: asyncio.Future[None] = loop.create_future()
        future.add_done_callback(wake)
        future.set_result(None)
        assert ran == ["inline"], "a settled future's callback no longer goes through loop.call_soon"

        queued: list[str] = []
        other: asyncio.Future[None] = loop.create_future()
        other.add_done_callback(lambda _f: queued.append("queued"))
        other.set_result(None)
        assert queued == []
        with trio.fail_after(5):
            while not queued:
                await trio.sleep(0.01)


async def test_a_statement_round_trip_through_the_bridge(db):
    """The driving loop in _drive steps asyncpg's coroutine by hand and marks
    each yielded future ``_asyncio_future_blocking = False``, as asyncio's
    Task does: a statement, a cancelled statement and a following statement
    all behave."""
    assert await db.fetchval("SELECT 41 + 1") == 42
    with trio.move_on_after(0.2) as scope:
        await db.execute("SELECT pg_sleep(5)")
    assert scope.cancelled_caught
    with trio.fail_after(10):
        assert await db.fetchval("SELECT 'after the cancel'") == "after the cancel"
