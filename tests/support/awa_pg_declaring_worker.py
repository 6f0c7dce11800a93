"""An awa-pg 0.6.1 runtime whose app declares its schedules in code.

Usage: python awa_pg_declaring_worker.py DSN MODULE:FUNCTION [--kind K:QUEUE ...]
       [--leader-election-interval-ms MS]

Calls FUNCTION(client) on its AsyncClient (the application's ``declare``),
registers a handler per ``--kind`` and starts. It leads (and so writes its
declarations into awa.cron_jobs) only if no one else holds the lock.
Prints ``READY`` once started and ``DONE <id> <attempt> <kind> <args JSON>``
when a handler runs; SIGTERM shuts it down.
"""

import argparse
import asyncio
import importlib
import json
import signal
import sys

import awa


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("declaration")
    parser.add_argument("--kind", action="append", default=[], help="KIND:QUEUE")
    parser.add_argument("--leader-election-interval-ms", type=int, default=200,
                        help="a long one keeps a runtime that started as a follower one")
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)
    module_name, _, function = args.declaration.partition(":")
    getattr(importlib.import_module(module_name), function)(client)
    queues = {"default"}
    for spec in args.kind:
        kind, _, queue = spec.partition(":")
        queues.add(queue)

        @client.task(dict, kind=kind, queue=queue)
        async def handle(job, _kind=kind):
            print("DONE", job.id, job.attempt, _kind, json.dumps(job.args, sort_keys=True), flush=True)

    await client.start(
        [{"name": queue, "max_workers": 2} for queue in sorted(queues)],
        storage_transition_role="canonical_drain",
        leader_election_interval_ms=args.leader_election_interval_ms,
        poll_interval_ms=50,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
