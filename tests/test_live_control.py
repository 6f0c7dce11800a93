"""Live control (issue 18 part 4): a leader resigns without a restart.

resign() uses the graceful release path (unlock + release NOTIFY), so the
follower takes over at once, and the resigner stays out for resign_hold_off.
Every wait is bounded with trio.fail_after.
"""

from __future__ import annotations

import trio
from support.helpers import leader_lock_holders

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import open_database

BOUND = 10.0


async def test_resign_hands_the_lock_to_the_follower_and_the_resigner_holds_off(database_url):
    config = MaintenanceConfig(takeover_poll_interval=0.1, leader_election_interval=0.2, resign_hold_off=3.0)
    first, second = MaintenanceService(database_url, config), MaintenanceService(database_url, config)
    async with open_database(database_url, pool_size=1, application_name="test admin") as admin:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(BOUND):
                await nursery.start(first.run)
                await first.wait_until_leader()
                await nursery.start(second.run)
                assert not second.resign()  # a follower has nothing to hand over
                old_pid = first.lock_backend_pid
                assert await leader_lock_holders(admin) == [old_pid]
                resigned_at = trio.current_time()
                assert first.resign()
                await second.wait_until_leader()
            assert trio.current_time() - resigned_at < 3.0
            new_pid = second.lock_backend_pid
            assert new_pid is not None and new_pid != old_pid
            assert await leader_lock_holders(admin) == [new_pid]

            # Inside its hold-off the resigner does not stand, even with the lock free.
            second.stop()
            with trio.fail_after(BOUND):
                while await leader_lock_holders(admin):
                    await trio.sleep(0.05)
            await trio.sleep(0.5)
            assert not first.is_leader
            # After it, it competes again.
            with trio.fail_after(BOUND):
                await first.wait_until_leader()
            assert trio.current_time() - resigned_at >= config.resign_hold_off
            nursery.cancel_scope.cancel()
