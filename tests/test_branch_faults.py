"""A database fault in one branch is logged, the others keep their cadence,
and the faulty branch recovers once the fault clears."""

import itertools

import trio
from support.probes import BodyRecorder

from awa_trio import MaintenanceConfig, MaintenanceService

INTERVAL = 0.05


async def test_locked_table_fails_one_branch_only_and_it_recovers(database_url, db, caplog):
    async def touch_jobs_hot(ctx, n):
        await ctx.db.fetchval("SELECT count(*) FROM awa.jobs_hot")

    sibling = BodyRecorder("sibling", INTERVAL, touch_jobs_hot)
    service = MaintenanceService(
        database_url,
        MaintenanceConfig(
            promote_interval=INTERVAL, leader_election_interval=0.2, lock_timeout="200ms"
        ),
        extra_branches=[sibling.spec],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        async with db.transaction() as locker:
            await locker.execute("LOCK TABLE awa.scheduled_jobs IN ACCESS EXCLUSIVE MODE")
            await locker.execute(
                "INSERT INTO awa.scheduled_jobs (kind, state, run_at) VALUES ('k', 'scheduled', now())"
            )
            fault_began = trio.current_time()
            with trio.fail_after(5):
                while caplog.text.count("promote_scheduled: failed to promote") < 3:
                    await trio.sleep(0.02)
            during_fault = [t for t in sibling.starts if t >= fault_began]
        assert "[55P03]" in caplog.text, "lock_timeout turns the stall into a logged error"
        gaps = [b - a for a, b in itertools.pairwise(during_fault)]
        assert len(during_fault) >= 5 and max(gaps) < 4 * INTERVAL, gaps

        # The lock is gone (transaction committed): the next tick promotes.
        with trio.fail_after(3):
            while await db.fetchval("SELECT count(*) FROM awa.jobs_hot WHERE kind = 'k'") != 1:
                await trio.sleep(0.02)
        assert service.is_leader
        nursery.cancel_scope.cancel()
