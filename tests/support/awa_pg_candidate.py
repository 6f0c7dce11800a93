"""An awa-pg 0.6.1 runtime that competes for leadership (upstream's Rust
leader inside it) and works no queue of the test's: for chaos runs beside
awa_trio candidates.

Usage: python awa_pg_candidate.py DSN [--election-interval-ms MS]
       [--periodic NAME=EXPR:QUEUE ...]

Registers each ``--periodic`` schedule (kind ``flap_tick``, args ``{}``), so
upstream syncs the same row awa_trio candidates register. Prints ``READY``
once started; SIGTERM shuts it down.
"""

import argparse
import asyncio
import dataclasses
import signal
import sys

import awa


@dataclasses.dataclass
class FlapTick:
    """Args of the chaos cron schedule's jobs (kind ``flap_tick``)."""


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--election-interval-ms", type=int, default=10_000)
    parser.add_argument("--periodic", action="append", default=[], help="NAME=EXPR:QUEUE")
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)

    @client.task(dict, kind="candidate_idle", queue="candidate_idle")
    async def idle(job):
        return None

    for spec in args.periodic:
        name, _, rest = spec.partition("=")
        expr, _, queue = rest.rpartition(":")
        client.periodic(name, expr, FlapTick, FlapTick(), queue=queue)

    await client.start(
        [{"name": "candidate_idle", "max_workers": 1}],
        storage_transition_role="canonical_drain",
        leader_election_interval_ms=args.election_interval_ms,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
