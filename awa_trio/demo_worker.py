"""An awa-pg runtime for ``python -m awa_trio demo``: it runs the demo's jobs
and never leads (awa_trio does). ``--die-on-first`` makes it take one
``slow_report`` job and then wait, so the demo can kill it mid-job.

    python -m awa_trio.demo_worker DSN [--die-on-first] [--role auto]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

DEMO_QUEUE = "demo"


async def main() -> None:
    import awa

    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--die-on-first", action="store_true")
    parser.add_argument("--role", default="auto")
    parser.add_argument("--queue", default=DEMO_QUEUE)
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)

    @client.task(dict, kind="send_email", queue=args.queue)
    async def send_email(job: Any) -> None:
        await asyncio.sleep(0.2)

    @client.task(dict, kind="demo_tick", queue=args.queue)
    async def tick(job: Any) -> None:
        return None

    @client.task(dict, kind="slow_report", queue=args.queue)
    async def slow_report(job: Any) -> None:
        print(f"STARTED {job.id} {job.attempt}", flush=True)
        if args.die_on_first:
            await asyncio.Event().wait()  # the demo kills this process now
        await asyncio.sleep(0.5)

    await client.start(
        [{"name": args.queue, "max_workers": 4}],
        storage_transition_role=args.role,
        poll_interval_ms=100,
        heartbeat_interval_ms=1000,
        leader_election_interval_ms=3_600_000,  # awa_trio leads the demo
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=1000)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
