"""A real awa-pg 0.6.1 runtime for the staged-transition tests (asyncio, own process).

Usage: python awa_pg_transition_worker.py DSN --queue Q [--queue Q2] --role ROLE [options]

Every runtime registers the same three kinds, whose behaviour is their name:
``ok`` completes at once, ``flaky`` raises on attempt 1 (so the job goes
retryable) and completes later, ``hang_first`` hangs on attempt 1 (a worker
to SIGKILL mid-job) and completes later. Jobs carry ``{"token": ...}``: the
canonical and queue-storage id sequences collide during a transition, so the
token, not the id, names a job. Prints ``READY`` once started, then
``START <token> <attempt> <kind> <id>`` and ``DONE <token> <attempt> <kind> <id>``,
flushed at once. SIGTERM shuts the runtime down gracefully.
"""

import argparse
import asyncio
import signal
import sys

import awa

KINDS = ("ok", "flaky", "hang_first")


def say(*words):
    print(*words, flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--queue", action="append", required=True)
    parser.add_argument("--role", required=True,
                        choices=("auto", "canonical_drain", "queue_storage_target"))
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--leader-election-interval-ms", type=int, default=600_000)
    args = parser.parse_args()

    client = awa.AsyncClient(args.dsn)
    for kind in KINDS:
        @client.task(dict, kind=kind, queue=args.queue[0])
        async def handle(job, _kind=kind):
            token = job.args.get("token") if isinstance(job.args, dict) else None
            say("START", token, job.attempt, _kind, job.id)
            if _kind == "hang_first" and job.attempt == 1:
                await asyncio.Event().wait()
            if _kind == "flaky" and job.attempt == 1:
                raise RuntimeError("flaky job fails its first attempt")
            say("DONE", token, job.attempt, _kind, job.id)

    # Should this runtime ever lead (it never should: awa_trio holds the lock
    # before any worker starts, and the election interval is long), its own
    # maintenance must not hide what awa_trio does.
    muted = 10**10
    await client.start(
        [{"name": queue, "max_workers": args.max_workers} for queue in args.queue],
        storage_transition_role=args.role,
        leader_election_interval_ms=args.leader_election_interval_ms,
        poll_interval_ms=50,
        promote_interval_ms=muted,
        heartbeat_rescue_interval_ms=muted,
        deadline_rescue_interval_ms=muted,
        callback_rescue_interval_ms=muted,
        queue_storage_schema="awa",
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    say("READY")
    await stop.wait()
    await client.shutdown(timeout_ms=2000)
    say("STOPPED")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
