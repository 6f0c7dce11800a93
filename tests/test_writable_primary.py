"""Only a writable primary is led from (issue 16).

Advisory locks work on a hot standby and are not replicated, and a
read-only server keeps a lock while every branch fails: a leader in either
place is worse than none. These tests use the main server with a database
made read-only; tests/test_failover.py has the standby and the failover.
"""

from __future__ import annotations

import logging

import trio
from conftest import ADMIN_DSN
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database

CONFIG = MaintenanceConfig(leader_election_interval=0.5, leader_check_interval=0.3, takeover_poll_interval=0.1)


async def set_read_only(database_url: str, on: bool) -> None:
    """The database's default for new sessions (as an operator would set it)."""
    database = database_url.rsplit("/", 1)[1]
    async with open_database(ADMIN_DSN) as admin:
        if on:
            await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        else:
            await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')


async def test_a_read_only_database_is_not_led_and_says_why_until_it_is_writable(
    database_url, db, caplog
):
    await set_read_only(database_url, True)
    service = MaintenanceService(database_url, CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio.leadership"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(10):
                while service.not_leading_reason is None:
                    await trio.sleep(0.05)
            await trio.sleep(1.5)  # a few more tries (each a new session, which stays read-only)
            assert not service.is_leader
            assert await leader_lock_holders(db) == []
            assert "read-only" in service.not_leading_reason
            assert (await service.status())["not_leading_reason"] == service.not_leading_reason
            # One line for the episode, however many tries.
            lines = [r for r in caplog.records if r.getMessage().startswith("not leading:")]
            assert len(lines) == 1, [r.getMessage() for r in lines]

            await set_read_only(database_url, False)
            with trio.fail_after(10):
                await service.wait_until_leader()
            assert service.not_leading_reason is None
            assert len(await leader_lock_holders(db)) == 1
            service.stop()


async def test_a_leader_whose_server_turns_read_only_steps_down(database_url, db, caplog):
    service = MaintenanceService(database_url, CONFIG)
    with caplog.at_level(logging.INFO, logger="awa_trio.leadership"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(10):
                await service.wait_until_leader()
            lock_pid = service.lock_backend_pid
            # The lock session turns read-only, as every session does after
            # ALTER SYSTEM SET default_transaction_read_only and a reload.
            await service._elector.lock_connection.execute("SET default_transaction_read_only = on")
            with trio.fail_after(10):
                await service.wait_until_follower()
                while lock_pid in await leader_lock_holders(db):  # released on the way out
                    await trio.sleep(0.05)
            # A new session of this database is writable: it leads again.
            with trio.fail_after(10):
                await service.wait_until_leader()
            service.stop()
    assert any("stepping down:" in r.getMessage() and "read-only" in r.getMessage() for r in caplog.records)


async def test_a_branch_that_fails_while_carrying_on_shows_in_status_and_the_error_metric(
    database_url, db, meter_provider, metric_reader
):
    from support.helpers import metric_points

    from awa_trio.body import BodyResult
    from awa_trio.branch import BranchSpec

    log = logging.getLogger("awa_trio.test_branch")

    async def half_failing(ctx):
        carried_on = BodyResult()
        carried_on.log_error(
            log, "test_branch: one step failed: [25006] cannot execute UPDATE in a read-only transaction")
        return carried_on

    spec = BranchSpec(name="half_failing", interval=0.1, run_once=half_failing)
    service = MaintenanceService(database_url, CONFIG, meter_provider=meter_provider, extra_branches=[spec])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(10):
            await service.wait_until_leader()
        await trio.sleep(0.5)
        status = await service.status()
        service.stop()
    assert "25006" in status["branches"]["half_failing"]["last_error"]
    errors = [point.value for attrs, point in metric_points(metric_reader, "awa_trio.branch.errors")
              if attrs.get("awa.maintenance.branch") == "half_failing"]
    assert errors and errors[0] >= 2, errors
