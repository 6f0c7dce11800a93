"""A real awa-pg 0.6.1 runtime in its own process (asyncio), for tests.

Usage: python awa_pg_worker.py DSN --kind K[:QUEUE] ... [--behaviour B] [options]

Registers one handler per kind. Behaviours: ``complete`` (return at once),
``hang`` (sleep forever: for kill -9 tests), ``fail`` (raise, so the job goes
retryable), ``hang-first`` (hang on attempt 1, complete on later attempts),
``callback`` (register an external callback of ``--callback-timeout-s`` and
wait for it: the job parks in ``waiting_external``), ``callback-first``
(callback on attempt 1, complete on later attempts), ``until-cancelled-first``
(on attempt 1, poll ``job.is_cancelled()`` every 10 ms until it is true,
print ``CANCELLED <id> <attempt> <kind> <unix ts>`` and return; complete on
later attempts).
``--max-workers`` sets the slots per queue (4); ``--deadline-ms`` gives every queue a hard deadline per attempt;
``--mute-rescue`` silences only this runtime's rescues (it still promotes
should it lead), ``--mute-maintenance`` its promotion too.
Prints ``READY`` once started, ``START <id> <attempt> <kind>`` when a handler
begins, ``WAITING <id> <attempt> <kind> <callback id>`` when it parks on a
callback and ``DONE <id> <attempt> <kind>`` when it completes, and, as the
handler returns (however it ends), the ledger line ``RAN <id> <attempt> <kind>
<start unix ts> <end unix ts>``; all flushed at once.
SIGTERM shuts the runtime down gracefully.
"""

import argparse
import asyncio
import signal
import sys
import time

import awa


def say(*words):
    print(*words, flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--kind", action="append", required=True, help="KIND or KIND:QUEUE")
    parser.add_argument("--behaviour", default="complete",
                        choices=("complete", "hang", "fail", "hang-first", "callback",
                                 "callback-first", "until-cancelled-first"))
    parser.add_argument("--role", default="canonical_drain")
    parser.add_argument("--leader-election-interval-ms", type=int, default=10_000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=None)
    parser.add_argument("--heartbeat-staleness-ms", type=int, default=None)
    parser.add_argument("--deadline-ms", type=int, default=None,
                        help="hard deadline of every attempt (queue deadline_duration_ms)")
    parser.add_argument("--callback-timeout-s", type=float, default=1.0)
    parser.add_argument("--max-workers", type=int, default=4, help="slots per queue")
    parser.add_argument("--mute-maintenance", action="store_true",
                        help="huge rescue/promote intervals, should this runtime ever lead")
    parser.add_argument("--mute-rescue", action="store_true",
                        help="huge rescue intervals only (promotion keeps running)")
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)

    async def behave(job, kind):
        say("START", job.id, job.attempt, kind)
        if args.behaviour == "until-cancelled-first" and job.attempt == 1:
            while not job.is_cancelled():
                await asyncio.sleep(0.01)
            say("CANCELLED", job.id, job.attempt, kind, f"{time.time():.6f}")
            return None
        if args.behaviour == "hang" or (args.behaviour == "hang-first" and job.attempt == 1):
            await asyncio.Event().wait()
        wants_callback = args.behaviour == "callback" or (
            args.behaviour == "callback-first" and job.attempt == 1)
        if wants_callback:
            token = await job.register_callback(timeout_seconds=args.callback_timeout_s)
            say("WAITING", job.id, job.attempt, kind, token.id)
            return awa.WaitForCallback(token)
        if args.behaviour == "fail":
            raise RuntimeError("worker asked to fail")
        say("DONE", job.id, job.attempt, kind)
        return None

    queues = {}
    for spec in args.kind:
        kind, _, queue = spec.partition(":")
        queue = queue or "default"
        queues[queue] = args.max_workers

        @client.task(dict, kind=kind, queue=queue)
        async def handle(job, _kind=kind):
            started = time.time()
            try:
                return await behave(job, _kind)
            finally:
                say("RAN", job.id, job.attempt, _kind, f"{started:.6f}", f"{time.time():.6f}")

    start_kwargs = dict(
        storage_transition_role=args.role,
        leader_election_interval_ms=args.leader_election_interval_ms,
        poll_interval_ms=50,
    )
    if args.heartbeat_interval_ms:
        start_kwargs["heartbeat_interval_ms"] = args.heartbeat_interval_ms
    if args.heartbeat_staleness_ms:
        start_kwargs["heartbeat_staleness_ms"] = args.heartbeat_staleness_ms
    if args.mute_maintenance:
        muted = 10**10
        start_kwargs.update(
            promote_interval_ms=muted,
            heartbeat_rescue_interval_ms=muted,
            deadline_rescue_interval_ms=muted,
            callback_rescue_interval_ms=muted,
        )
    if args.mute_rescue:
        muted = 10**10
        start_kwargs.update(
            heartbeat_rescue_interval_ms=muted,
            deadline_rescue_interval_ms=muted,
            callback_rescue_interval_ms=muted,
        )
    queue_configs = []
    for queue, workers in queues.items():
        config = {"name": queue, "max_workers": workers}
        if args.deadline_ms is not None:
            config["deadline_duration_ms"] = args.deadline_ms
        queue_configs.append(config)
    await client.start(queue_configs, **start_kwargs)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    say("READY")
    await stop.wait()
    await client.shutdown(timeout_ms=2000)
    say("STOPPED")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
