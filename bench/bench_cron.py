"""Cron fire-time benchmark: prints figures, asserts nothing.

    python bench/bench_cron.py [--schedules 1000] [--database-url URL]

1. One evaluator pass over N schedules (pure computation): a mix of
   per-second, per-minute, hourly, daily and weekday schedules in several
   zones, each with ``last_enqueued_at`` at its previous fire (the steady
   state), so some are due and most are not. Cold = first pass (parsing,
   croniter set-up); warm = later passes.
2. Coalescing after an outage, for a per-second schedule: one minute vs one
   day vs one year missed. The backward search makes these cost the same.
3. catch_up of 1,000 missed fires (the per-pass limit), for scale.
4. With ``--database-url`` (a migrated awa database you can write to): one
   real evaluator pass over N rows (list + compute + the due enqueues). The
   rows and their jobs are deleted afterwards.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from datetime import UTC, datetime, timedelta

from awa_trio.cron import CronSchedule, MissedFirePolicy, compute_fire_times, parse_cron_expression
from awa_trio.cron.expressions import CronExpression
from awa_trio.cron.fire_times import _first_fire

EXPRESSIONS = [
    "* * * * * *", "*/10 * * * * *", "* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *",
    "0 9 * * 1-5", "0 0 1 * *", "0 0 L * *", "0 0 * * 5L", "15 10 * * 1#2", "0 0 13 * 5",
    "0 */15 * * * *", "@daily", "@hourly", "0 8-18/2 * * MON-FRI",
]
ZONES = ["UTC", "Europe/London", "America/New_York", "Pacific/Auckland", "Asia/Kolkata"]
NOW = datetime(2026, 5, 7, 12, 0, 20, 500000, tzinfo=UTC)


def timed(function, repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def steady_state_schedules(count: int):
    schedules = []
    for index, (expression, zone) in enumerate(itertools.islice(
            itertools.cycle(itertools.product(EXPRESSIONS, ZONES)), count)):
        schedule = CronSchedule.parse(expression, zone)
        previous = schedule.latest_fire(NOW - timedelta(days=400), NOW - timedelta(seconds=1 + index % 3))
        schedules.append((schedule, previous))
    return schedules


def evaluator_pass(schedules, *, forget: bool = False) -> int:
    due = 0
    for schedule, last in schedules:
        if forget:
            _first_fire.cache_clear()
        due += len(compute_fire_times(schedule, policy=MissedFirePolicy.COALESCE,
                                      created_at=last, last_enqueued_at=last, now=NOW))
    return due


def count_searches(function) -> int:
    calls = [0]
    originals = {name: getattr(CronExpression, name) for name in ("next_match", "prev_match")}

    def counting(original):
        def wrapper(self, wall_clock):
            calls[0] += 1
            return original(self, wall_clock)
        return wrapper

    try:
        for name, original in originals.items():
            setattr(CronExpression, name, counting(original))
        function()
    finally:
        for name, original in originals.items():
            setattr(CronExpression, name, original)
    return calls[0]


def bench_pure(count: int) -> None:
    parse_cron_expression.cache_clear()
    started = time.perf_counter()
    schedules = steady_state_schedules(count)
    setup = time.perf_counter() - started

    def cold_pass():
        return evaluator_pass(schedules, forget=True)  # every schedule from scratch

    due = cold_pass()
    cold = timed(cold_pass, 5)
    warm = timed(lambda: evaluator_pass(schedules), 5)
    print(f"evaluator pass, {count} schedules ({len(EXPRESSIONS)} expressions x {len(ZONES)} zones), "
          f"{due} due:")
    print(f"  parse + set-up           {setup * 1000:8.1f} ms (once per expression text)")
    print(f"  pass, from scratch       {cold * 1000:8.1f} ms  ({cold / count * 1e6:.0f} us per schedule)")
    print(f"  pass, idle ones memoised {warm * 1000:8.1f} ms  ({warm / count * 1e6:.0f} us per schedule)")

    per_second = CronSchedule.parse("* * * * * *", "Europe/London")
    print("coalesce after an outage, per-second schedule (median of 50, from scratch):")
    for label, outage in [("1 minute", timedelta(minutes=1)), ("1 day", timedelta(days=1)),
                          ("1 year", timedelta(days=365))]:
        last = NOW.replace(microsecond=0) - outage

        def coalesce(last=last):
            _first_fire.cache_clear()
            return compute_fire_times(per_second, policy=MissedFirePolicy.COALESCE,
                                      created_at=last, last_enqueued_at=last, now=NOW)

        seconds = timed(coalesce, 50)
        searches = count_searches(coalesce)
        print(f"  {label:9s} outage  {seconds * 1e6:8.1f} us  ({searches} calendar searches, "
              f"{int(outage.total_seconds())} missed fires)")

    last = NOW.replace(microsecond=0) - timedelta(days=1)
    catch_up = timed(lambda: compute_fire_times(per_second, policy=MissedFirePolicy.CATCH_UP,
                                                created_at=last, last_enqueued_at=last, now=NOW), 5)
    print(f"catch_up, 1000 fires (one pass at the limit)  {catch_up * 1000:8.1f} ms")


async def bench_database(url: str, count: int) -> None:
    from awa_trio.cron import PeriodicJob
    from awa_trio.cron.branches import evaluate_schedules
    from awa_trio.cron.store import upsert_cron_job
    from awa_trio.db import open_database

    prefix = "bench_cron_"
    async with open_database(url) as db:
        try:
            for index, (expression, zone) in enumerate(itertools.islice(
                    itertools.cycle(itertools.product(EXPRESSIONS, ZONES)), count)):
                job = PeriodicJob(f"{prefix}{index:05d}", expression, kind="bench_cron", timezone=zone)
                await upsert_cron_job(db, job)
            first = await timed_async(evaluate_schedules, db)
            second = await timed_async(evaluate_schedules, db)
            print(f"database evaluator pass, {count} rows:")
            print(f"  first (first registrations fire) {first[0] * 1000:8.1f} ms, "
                  f"{len(first[1].enqueued)} enqueued")
            print(f"  next                             {second[0] * 1000:8.1f} ms, "
                  f"{len(second[1].enqueued)} enqueued")
        finally:
            await db.execute("DELETE FROM awa.cron_jobs WHERE name LIKE $1", prefix + "%")
            await db.execute("DELETE FROM awa.jobs_hot WHERE kind = 'bench_cron'")


async def timed_async(function, *args):
    started = time.perf_counter()
    result = await function(*args)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    bench_pure(args.schedules)
    if args.database_url:
        import trio

        trio.run(bench_database, args.database_url, args.schedules)


if __name__ == "__main__":
    main()
