"""A real awa-pg runtime whose handlers write every execution to a ledger, so
a test can prove exactly-once by id (see support/ledger.py).

Each handler first inserts ``(job_id, attempt, kind)`` into
``awa_test_ledger.runs`` (its own schema, outside ``awa``), then behaves by
kind:

- ``ok``: completes at once;
- ``retry``: raises ``RetryAfter`` on attempt 1 (the job goes retryable and
  the leader must promote it), completes on attempt 2;
- ``fail``: raises (inserted with ``max_attempts=2``: one retry, then failed);
- ``slow``: sleeps 0.3 s, then completes;
- ``callback``: registers an external callback and parks on
  ``waiting_external``; a task of this process completes the callback
  ``--callback-delay-s`` later, as an external system would.

Usage: python awa_pg_ledger_worker.py DSN --queue Q [--queue Q2 ...]
       [--workers N] [--role auto|canonical_drain] [--lead] [--retry-after-s S]
       [--start-option NAME=INTEGER ...]  (more options of awa-pg's start())
Prints READY once started; SIGTERM shuts it down.
"""

import argparse
import asyncio
import signal
import sys

import asyncpg
import awa

RECORD_SQL = "INSERT INTO awa_test_ledger.runs (job_id, attempt, kind) VALUES ($1, $2, $3)"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--queue", action="append", required=True)
    parser.add_argument("--workers", type=int, default=16, help="slots per queue")
    parser.add_argument("--role", default="auto", help="storage_transition_role")
    parser.add_argument("--lead", action="store_true",
                        help="compete for leadership at once (default: wait 10 min first)")
    parser.add_argument("--retry-after-s", type=float, default=0.2)
    parser.add_argument("--callback-delay-s", type=float, default=0.2)
    parser.add_argument("--start-option", action="append", default=[],
                        help="NAME=INTEGER for awa-pg's start(), e.g. queue_storage_queue_rotate_interval_ms=200")
    args = parser.parse_args()
    start_options = {name: int(value) for name, _, value in
                     (option.partition("=") for option in args.start_option)}

    pool = await asyncpg.create_pool(args.dsn, min_size=1, max_size=8)
    client = awa.AsyncClient(args.dsn)
    completions: set[asyncio.Task] = set()

    async def record(job, kind: str) -> None:
        await pool.execute(RECORD_SQL, job.id, job.attempt, kind)

    async def complete_later(callback_id: str) -> None:
        await asyncio.sleep(args.callback_delay_s)
        for _ in range(200):
            try:
                await client.complete_external(callback_id, {"ok": True})
                return
            except Exception:  # not parked yet: the handler is still returning
                await asyncio.sleep(0.05)
        print(f"CALLBACK-NOT-COMPLETED {callback_id}", flush=True)

    for queue in args.queue:

        @client.task(dict, kind="ok", queue=queue)
        async def ok(job):
            await record(job, "ok")

        @client.task(dict, kind="retry", queue=queue)
        async def retry(job):
            await record(job, "retry")
            if job.attempt == 1:
                return awa.RetryAfter(args.retry_after_s)
            return None

        @client.task(dict, kind="fail", queue=queue)
        async def fail(job):
            await record(job, "fail")
            raise RuntimeError("ledger worker fails this kind on purpose")

        @client.task(dict, kind="slow", queue=queue)
        async def slow(job):
            await record(job, "slow")
            await asyncio.sleep(0.3)

        @client.task(dict, kind="callback", queue=queue)
        async def callback(job):
            await record(job, "callback")
            token = await job.register_callback(timeout_seconds=600)
            task = asyncio.create_task(complete_later(token.id))
            completions.add(task)
            task.add_done_callback(completions.discard)
            return awa.WaitForCallback(token)

    await client.start(
        [{"name": queue, "max_workers": args.workers} for queue in args.queue],
        storage_transition_role=args.role,
        poll_interval_ms=50,
        leader_election_interval_ms=1000 if args.lead else 600_000,
        **start_options,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)
    for task in completions:
        task.cancel()
    await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
