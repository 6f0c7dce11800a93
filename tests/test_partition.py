"""A silent network partition between the leader and PostgreSQL, through a
TCP proxy that holds every byte while keeping every socket open.

The partitioned leader cannot tell the server anything, so it must stop on
its own: its lock check times out, it stops every branch, and it never
hangs. The server keeps the session (and the lock) until it gives up on the
client; then another node leads. When the network heals the old leader
rejoins as a candidate.
"""

from urllib.parse import urlsplit, urlunsplit

import trio
from support.helpers import leader_lock_holders
from support.probes import BodyRecorder, assert_bodies_ran_only_while_leading
from support.proxy import postgres_proxy
from test_leadership import CHECK, ELECTION, FAST

from awa_trio import MaintenanceService


def through(proxy, database_url: str) -> str:
    parts = urlsplit(database_url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))


async def test_partitioned_leader_steps_down_and_another_takes_over(database_url, db, caplog):
    server = urlsplit(database_url)
    async with postgres_proxy(server.hostname or "localhost", server.port or 5432) as proxy:
        probe = BodyRecorder("probe", 0.02)
        partitioned = MaintenanceService(
            through(proxy, database_url), FAST, extra_branches=[probe.spec])
        peer = MaintenanceService(database_url, FAST)
        async with trio.open_nursery() as nursery:
            await nursery.start(partitioned.run)
            await partitioned.wait_until_leader()
            await nursery.start(peer.run)
            await trio.sleep(0.2)
            assert probe.starts and not peer.is_leader

            proxy.freeze()
            frozen_at = trio.current_time()
            with trio.fail_after(2 * CHECK + 1):
                await partitioned.wait_until_follower()
            # One check interval to notice nothing, one check timeout to give up.
            assert trio.current_time() - frozen_at <= 2 * CHECK + 0.3
            assert f"lost maintenance leadership: lock check failed: no answer within {CHECK:g}s" in caplog.text
            bodies = len(probe.starts)

            # The server still holds the frozen session's lock: nobody leads,
            # and the old leader runs nothing.
            await trio.sleep(4 * ELECTION)
            assert not peer.is_leader
            assert len(probe.starts) == bodies
            assert len(await leader_lock_holders(db)) == 1

            # The server gives up on the client (keepalive): the lock is free.
            proxy.cut()
            with trio.fail_after(ELECTION + 2):
                await peer.wait_until_leader()
            assert await leader_lock_holders(db) == [peer.lock_backend_pid]

            # The network heals: the old leader is a live candidate again.
            proxy.heal()
            peer.stop()
            with trio.fail_after(10):
                await partitioned.wait_until_leader()
            with trio.fail_after(2):
                while len(probe.starts) <= bodies:
                    await trio.sleep(0.01)
            assert partitioned.is_alive
            assert await leader_lock_holders(db) == [partitioned.lock_backend_pid]
            assert_bodies_ran_only_while_leading(partitioned, probe)
            nursery.cancel_scope.cancel()
