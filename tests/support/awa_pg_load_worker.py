"""An awa-pg runtime for load runs: kind ``ok`` completes, ``leased``
completes through a leases row, kind ``boom`` raises (with max_attempts 1 it
fails terminally). Optionally it may lead
(upstream's Rust maintenance), with ring intervals from the command line.

Usage: python awa_pg_load_worker.py DSN [--queue Q] [--workers N] [--lead]
       [--queue-rotate-ms MS --lease-rotate-ms MS --claim-rotate-ms MS]
Prints READY once started; SIGTERM shuts it down.
"""

import argparse
import asyncio
import signal
import sys

import awa


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--queue", default="load")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--lead", action="store_true",
                        help="compete for leadership at once (default: wait 10 min first)")
    parser.add_argument("--queue-rotate-ms", type=int, default=1000)
    parser.add_argument("--lease-rotate-ms", type=int, default=250)
    parser.add_argument("--claim-rotate-ms", type=int, default=None)
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)

    @client.task(dict, kind="ok", queue=args.queue)
    async def ok(job):
        return None

    @client.task(dict, kind="leased", queue=args.queue)
    async def leased(job):
        # Registering a callback materialises the attempt as a leases row
        # (the fast claim path writes none), so the lease ring has work too.
        await job.register_callback(timeout_seconds=3600)
        return None

    @client.task(dict, kind="boom", queue=args.queue)
    async def boom(job):
        raise RuntimeError("load worker fails this kind on purpose")

    await client.start(
        [{"name": args.queue, "max_workers": args.workers}],
        storage_transition_role="auto",
        poll_interval_ms=50,
        leader_election_interval_ms=1000 if args.lead else 600_000,
        queue_storage_queue_rotate_interval_ms=args.queue_rotate_ms,
        queue_storage_lease_rotate_interval_ms=args.lease_rotate_ms,
        queue_storage_claim_rotate_interval_ms=args.claim_rotate_ms,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
