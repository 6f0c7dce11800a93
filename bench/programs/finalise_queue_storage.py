"""Finalises a migrated fresh Awa install to queue storage the way every
default Awa 0.6 install gets there: an awa-pg 0.6.1 runtime with transition
role ``auto`` starts on it. Waits (10 s at most) until the storage status is
active, a second more, then shuts the runtime down. Its rings are given
10-minute rotations, so a copy starts at slot 0, generation 0.

    python bench/programs/finalise_queue_storage.py DSN
"""

import asyncio
import json
import sys

import awa

PINNED_MS = 600_000


async def main(dsn: str) -> None:
    client = awa.AsyncClient(dsn)

    @client.task(dict, kind="noop", queue="default")
    async def noop(job):
        pass

    await client.start([("default", 1)], storage_transition_role="auto", leader_election_interval_ms=PINNED_MS,
                       queue_storage_queue_rotate_interval_ms=PINNED_MS,
                       queue_storage_lease_rotate_interval_ms=PINNED_MS,
                       queue_storage_claim_rotate_interval_ms=PINNED_MS)
    for _ in range(100):
        status = await client.storage_status()  # a JSON report in 0.6.1
        if (json.loads(status) if isinstance(status, str) else status).get("state") == "active":
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    await client.shutdown(timeout_ms=1000)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: finalise_queue_storage.py DSN")
    asyncio.run(main(sys.argv[1]))
