"""An awa-pg 0.6.1 runtime for the benches: one queue of jobs that complete
at once (or hang, ``mode=hang``), and upstream's maintenance leader whenever
it wins the lock. Prints READY once started; SIGTERM shuts it down.

    python bench/programs/awa_pg_runtime.py DSN [kind=bench_idle] [queue=bench_idle]
        [workers=1] [mode=complete|hang|stamp] [role=auto|canonical_drain] [START_OPTION=VALUE ...]

cron=EXPR registers a periodic job ``bench_cron`` of that expression (kind
and queue as above) before starting.

mode=stamp: each handler prints ``LATE <job id> <seconds>`` as it starts, the
seconds since the unix time in the job's ``due`` argument (bench_on_time).

Any other NAME=VALUE is a keyword of ``AsyncClient.start()`` (an int if it
reads as one, else a float). Parsed by hand rather than with argparse:
bench_idle counts this process's start-up CPU.
"""

import asyncio
import signal
import sys
import time

import awa


def value_of(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


async def main(dsn: str, options: dict[str, int | float | str]) -> None:
    kind, queue = str(options.pop("kind", "bench_idle")), str(options.pop("queue", "bench_idle"))
    mode = options.pop("mode", "complete")
    workers, hang, stamp = int(options.pop("workers", 1)), mode == "hang", mode == "stamp"
    role = options.pop("role", "auto")
    cron = options.pop("cron", None)
    client = awa.AsyncClient(dsn)
    if cron is not None:
        client.periodic("bench_cron", str(cron), dict, {}, queue=queue)

    @client.task(dict, kind=kind, queue=queue)
    async def work(job):
        if stamp:
            print(f"LATE {job.id} {time.time() - float(job.args['due']):.6f}", flush=True)
        if hang:
            await asyncio.Event().wait()

    await client.start([(queue, workers)], storage_transition_role=role, **options)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=2000)


if __name__ == "__main__":
    pairs = [arg.partition("=") for arg in sys.argv[2:]]
    if len(sys.argv) < 2 or any(not sep for _, sep, _ in pairs):
        raise SystemExit("usage: awa_pg_runtime.py DSN [NAME=VALUE ...]")
    asyncio.run(main(sys.argv[1], {name: value_of(value) for name, _, value in pairs}))
