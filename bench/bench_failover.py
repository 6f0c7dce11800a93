"""Failover: awa_trio against upstream's leader (inside an awa-pg 0.6.1
runtime), each on its own database, both on default settings.

* SIGKILL takeover: a leader and a follower process run; the leader is
  killed; time until pg_locks shows another holder of the leader lock
  (polled every 5 ms). A new follower is started for the next run.
* graceful handover: the leader gets SIGTERM; time until another holder.
* mixed fleet: an awa-pg leader is killed with an awa_trio follower waiting.
* HA failover (``--ha-runs``): a real primary and streaming standby
  (tests/support/replica.py); awa_trio is given both hosts with
  ``target_session_attrs=read-write``; the primary is stopped (immediate)
  and the standby promoted; time from the promotion completing (``pg_ctl
  promote -w`` returns: the server accepts writes) to the lock held there
  and to a due job, inserted at once, promoted there. awa-pg 0.6.1's leader
  is not measured: sqlx refuses a multi-host URL.
* follower CPU: user + system time of the follower process (from /proc)
  over a window, as a share of one core. The awa-pg follower is a whole
  runtime (one idle queue), which it cannot run without.

``--designs`` first measures the follower mechanisms considered (plain
asyncpg, one follower, the lock held by another session): a blocking
``pg_advisory_lock``; ``pg_advisory_lock`` under a 200 ms ``lock_timeout``;
a ``pg_try_advisory_lock`` poll. For each: takeover after the holder's
backend dies, how often the follower holds a snapshot and how old
(pg_stat_activity sampled at 20 Hz), how often it waits on a lock, and how
many ERROR lines per second it writes to the server log; then awa_trio's
follower CPU at three poll intervals.

Linux only (/proc). Needs awa-pg (the test extra) and a local PostgreSQL.

    python bench/bench_failover.py [--server postgresql://postgres@localhost:5432]
        [--runs 20] [--graceful-runs 5] [--mixed-runs 10] [--ha-runs 5] [--cpu-seconds 60] [--designs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import _common
import asyncpg

REPO_ROOT = str(_common.ROOT)
LOCK_HOLDERS_SQL = _common.lock_holders_sql("coalesce(array_agg(pid ORDER BY pid), '{}')")


def start_process(kind: str, dsn: str, *flags: str) -> subprocess.Popen:
    if kind == "awa_trio":
        argv = _common.awa_trio_argv(dsn, "--log-level", "WARNING", *flags)
    else:  # a whole runtime (one idle queue), on default settings
        argv = _common.awa_pg_runtime(dsn, role="canonical_drain")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_common.repo_env())


def stop(process: subprocess.Popen) -> None:
    _common.stop(process, signal.SIGKILL)


async def holders(conn) -> list[int]:
    return list(await conn.fetchval(LOCK_HOLDERS_SQL))


async def wait_for_holder(conn, not_in: list[int], timeout: float = 60.0, poll: float = 0.005) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        current = await holders(conn)
        if current and not set(current) & set(not_in):
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError("no new holder of the leader lock")
        await asyncio.sleep(poll)


async def backends(conn) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()")


#: Each follower's default poll period: awa_trio's takeover_poll_interval,
#: awa-pg's leader_election_interval.
FOLLOWER_POLL = {"awa_trio": 0.25, "awa-pg": 10.0}
ELECTION_BACKENDS_SQL = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE 'awa_trio % lock'
"""


async def follower_ready(conn, kind: str, backends_before: int, *, awa_trio_candidates: int = 2,
                         timeout: float = 60.0) -> None:
    """awa_trio: its election connection is open (``awa_trio_candidates``
    of them in the database, the leader's included). awa-pg, which elects on pooled connections: one more
    backend, then 1 s for the runtime's first attempt."""
    deadline = time.perf_counter() + timeout
    if kind == "awa_trio":
        while await conn.fetchval(ELECTION_BACKENDS_SQL) < awa_trio_candidates:
            if time.perf_counter() > deadline:
                raise TimeoutError("the awa_trio follower did not start")
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # past its first try
        return
    while await backends(conn) <= backends_before:
        if time.perf_counter() > deadline:
            raise TimeoutError("the awa-pg follower did not start")
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)


async def failover_runs(kind: str, dsn: str, runs: int, graceful_runs: int) -> dict[str, list[float]]:
    """SIGKILL then SIGTERM of the current leader, a fresh follower each time."""
    conn = await asyncpg.connect(dsn)
    results: dict[str, list[float]] = {"sigkill": [], "graceful": []}
    leader = start_process(kind, dsn)
    follower = None
    try:
        await wait_for_holder(conn, [], timeout=60)
        for number in range(runs + graceful_runs):
            before = await backends(conn)
            follower = start_process(kind, dsn)
            await follower_ready(conn, kind, before)
            # Kill at a random phase of the follower's poll, as a crash would.
            await asyncio.sleep(random.uniform(0, FOLLOWER_POLL[kind]))
            old = await holders(conn)
            graceful = number >= runs
            began = time.perf_counter()
            leader.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            took = await wait_for_holder(conn, old, timeout=60) - began
            results["graceful" if graceful else "sigkill"].append(took)
            stop(leader)
            leader, follower = follower, None
    finally:
        stop(leader)
        if follower is not None:
            stop(follower)
        await conn.close()
    return results


async def mixed_runs(dsn: str, runs: int) -> list[float]:
    """An awa-pg leader SIGKILLed with an awa_trio follower waiting."""
    conn = await asyncpg.connect(dsn)
    took: list[float] = []
    try:
        for _ in range(runs):
            leader = start_process("awa-pg", dsn)
            follower = None
            try:
                await wait_for_holder(conn, [], timeout=60)
                follower = start_process("awa_trio", dsn)
                await follower_ready(conn, "awa_trio", 0, awa_trio_candidates=1)
                await asyncio.sleep(random.uniform(0, FOLLOWER_POLL["awa_trio"]))
                old = await holders(conn)
                began = time.perf_counter()
                leader.send_signal(signal.SIGKILL)
                took.append(await wait_for_holder(conn, old, timeout=60) - began)
            finally:
                stop(leader)
                if follower is not None:
                    follower.terminate()
                    try:
                        follower.wait(10)
                    except subprocess.TimeoutExpired:
                        follower.kill()
            deadline = time.perf_counter() + 10
            while await holders(conn) and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
    finally:
        await conn.close()
    return took


async def follower_cpu(pairs: list[tuple[str, str, tuple[str, ...]]], seconds: float) -> list[float]:
    """Share of a core used by each follower over the same window."""
    started: list[tuple[subprocess.Popen, subprocess.Popen]] = []
    try:
        for kind, dsn, flags in pairs:
            conn = await asyncpg.connect(dsn)
            leader = start_process(kind, dsn, *flags)
            await wait_for_holder(conn, [], timeout=60)
            await conn.close()
            started.append((leader, start_process(kind, dsn, *flags)))
        await asyncio.sleep(5.0)  # start-up is not following
        before = [_common.cpu_seconds(follower.pid) for _, follower in started]
        await asyncio.sleep(seconds)
        return [(_common.cpu_seconds(follower.pid) - b) / seconds for (_, follower), b in zip(started, before, strict=True)]
    finally:
        for leader, follower in started:
            stop(follower)
            stop(leader)


# -- design options ---------------------------------------------------------

SNAPSHOT_SQL = """
    SELECT backend_xmin IS NOT NULL AS pinned,
           coalesce(extract(epoch FROM clock_timestamp() - xact_start), 0)::float8 AS age,
           wait_event_type = 'Lock' AS lock_wait
    FROM pg_stat_activity WHERE pid = $1
"""
DESIGN_KEY = 77_000_001


async def _blocking(conn, got, resume, errors):
    while True:
        await conn.fetchval("SELECT pg_advisory_lock($1)", DESIGN_KEY)
        got.set()
        await resume.wait()
        resume.clear()


async def _short_waits(conn, got, resume, errors):
    await conn.execute("SET lock_timeout = '200ms'")
    while True:
        try:
            await conn.fetchval("SELECT pg_advisory_lock($1)", DESIGN_KEY)
        except asyncpg.LockNotAvailableError:
            errors.append(1)  # one ERROR (and STATEMENT) line in the server log
            continue
        got.set()
        await resume.wait()
        resume.clear()


def _poll(interval: float):
    async def loop(conn, got, resume, errors):
        while True:
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", DESIGN_KEY):
                got.set()
                await resume.wait()
                resume.clear()
            await asyncio.sleep(interval)
    return loop


async def measure_design(dsn: str, follow, runs: int = 10, sample_seconds: float = 5.0) -> dict:
    admin = await asyncpg.connect(dsn)
    holder = await asyncpg.connect(dsn)
    assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", DESIGN_KEY)
    follower = await asyncpg.connect(dsn)
    got, resume, errors = asyncio.Event(), asyncio.Event(), []
    task = asyncio.create_task(follow(follower, got, resume, errors))
    try:
        await asyncio.sleep(0.3)
        samples, pinned, oldest, lock_waits = 0, 0, 0.0, 0
        errors.clear()
        end = time.perf_counter() + sample_seconds
        while time.perf_counter() < end:
            row = await admin.fetchrow(SNAPSHOT_SQL, follower.get_server_pid())
            samples += 1
            pinned += row["pinned"]
            lock_waits += bool(row["lock_wait"])
            if row["pinned"]:
                oldest = max(oldest, row["age"])
            await asyncio.sleep(0.05)
        error_rate = len(errors) / sample_seconds
        takeovers = []
        for number in range(runs):
            began = time.perf_counter()
            holder.terminate()
            await got.wait()
            takeovers.append(time.perf_counter() - began)
            await asyncio.sleep(0.01)
            got.clear()
            await follower.execute("SELECT pg_advisory_unlock($1)", DESIGN_KEY)
            holder = await asyncpg.connect(dsn)
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", DESIGN_KEY)
            resume.set()
            await asyncio.sleep(0.2 + 0.037 * number)
    finally:
        task.cancel()
        for conn in (holder, follower, admin):
            conn.terminate()
    return {
        "p50": statistics.median(takeovers), "max": max(takeovers),
        "pinned": pinned / samples, "oldest": oldest, "lock_waits": lock_waits / samples,
        "errors": error_rate,
    }


async def designs(server: str, template: str, cpu_seconds_each: float) -> None:
    dsn = await create_database(server, template)
    try:
        print("follower designs (plain asyncpg; lock held by another session, whose backend is then "
              "terminated; 20 Hz pg_stat_activity samples)")
        print(f"{'design':<38}{'takeover p50':>13}{'max':>8}{'snapshot held':>15}{'oldest':>9}"
              f"{'lock wait':>11}{'ERROR lines/s':>15}")
        for label, follow in (("blocking pg_advisory_lock", _blocking),
                              ("pg_advisory_lock, lock_timeout 200ms", _short_waits),
                              ("pg_try_advisory_lock every 100 ms", _poll(0.1)),
                              ("pg_try_advisory_lock every 250 ms", _poll(0.25))):
            r = await measure_design(dsn, follow)
            print(f"{label:<38}{r['p50'] * 1000:>10.0f} ms{r['max'] * 1000:>5.0f} ms"
                  f"{r['pinned'] * 100:>14.0f}%{r['oldest']:>8.2f}s{r['lock_waits'] * 100:>10.0f}%"
                  f"{r['errors']:>15.1f}")
    finally:
        await _common.drop_database(server, dsn)
    intervals = ("100ms", "250ms", "1s")
    dsns = [await create_database(server, template) for _ in intervals]
    try:
        shares = await follower_cpu(
            [("awa_trio", dsn, ("--takeover-poll-interval", interval))
             for dsn, interval in zip(dsns, intervals, strict=True)], cpu_seconds_each)
        print(f"\nawa_trio follower CPU by takeover_poll_interval ({cpu_seconds_each:.0f} s, same window)")
        for interval, share in zip(intervals, shares, strict=True):
            print(f"  {interval:>6}: {share * 100:.2f} % of a core")
    finally:
        for dsn in dsns:
            await _common.drop_database(server, dsn)
    print()


# -- databases ---------------------------------------------------------------


async def create_database(server: str, template: str) -> str:
    return await _common.copy_database(server, template, "awa_trio_failover")


DUE_JOB_SQL = (
    "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
    "VALUES ('ha_due', 'ha', 'scheduled', now() - interval '1 second') RETURNING id"
)
JOB_STATE_SQL = "SELECT state::text FROM awa.jobs WHERE id = $1"


async def ha_runs(runs: int) -> dict[str, list[float]]:
    """Seconds from the standby's promotion to the lock, and to a due job
    promoted, on the new primary (a fresh pair of servers per run)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    from support.replica import replica_cluster

    times: dict[str, list[float]] = {"lock": [], "job": []}
    for _ in range(runs):
        with replica_cluster() as cluster:
            primary, standby = cluster.primary, cluster.standby
            subprocess.run([sys.executable, "-m", "awa_trio", "migrate", "--database-url", primary.url()],
                           check=True, capture_output=True, cwd=REPO_ROOT)
            url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
                   "?target_session_attrs=read-write")
            leader = start_process("awa_trio", url)
            try:
                conn = await asyncpg.connect(primary.url())
                try:
                    await wait_for_holder(conn, [])
                finally:
                    await conn.close()
                time.sleep(random.uniform(0.0, 1.0))  # the stop lands at any phase of the leader's ticks
                primary.stop("immediate")
                standby.promote()
                promoted = time.perf_counter()
                conn = await asyncpg.connect(standby.url())
                try:
                    job_id = await conn.fetchval(DUE_JOB_SQL)
                    times["lock"].append(await wait_for_holder(conn, []) - promoted)
                    while await conn.fetchval(JOB_STATE_SQL, job_id) != "available":
                        await asyncio.sleep(0.005)
                    times["job"].append(time.perf_counter() - promoted)
                finally:
                    await conn.close()
            finally:
                stop(leader)
    return times


async def print_ha(runs: int) -> None:
    ha = await ha_runs(runs)
    print(f"\nHA failover, multi-host URL, primary stopped and standby promoted ({runs} runs), "
          f"from the promotion: lock held p50 {statistics.median(ha['lock']):.3f}s "
          f"(max {max(ha['lock']):.3f}s), due job promoted p50 {statistics.median(ha['job']):.3f}s "
          f"(max {max(ha['job']):.3f}s)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=_common.SERVER)
    parser.add_argument("--runs", type=int, default=20, help="SIGKILL runs per leader")
    parser.add_argument("--graceful-runs", type=int, default=5)
    parser.add_argument("--mixed-runs", type=int, default=10,
                        help="awa-pg leader SIGKILLed, awa_trio follower")
    parser.add_argument("--ha-runs", type=int, default=5,
                        help="primary stopped, standby promoted (0 to skip)")
    parser.add_argument("--ha-only", action="store_true", help="only the HA failover runs")
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--designs", action="store_true", help="measure the follower designs first")
    parser.add_argument("--skip-upstream", action="store_true",
                        help="awa_trio rows only (upstream's take ~10 s per run)")
    args = parser.parse_args()

    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    if args.ha_only:
        await print_ha(max(1, args.ha_runs))
        return
    template = await _common.make_template(args.server, "awa_trio_failover")
    try:
        if args.designs:
            await designs(args.server, template, min(args.cpu_seconds, 30.0))
        results = {}
        kinds = ("awa_trio",) if args.skip_upstream else ("awa_trio", "awa-pg")
        for kind in kinds:
            dsn = await create_database(args.server, template)
            try:
                results[kind] = await failover_runs(kind, dsn, args.runs, args.graceful_runs)
            finally:
                await _common.drop_database(args.server, dsn)
        dsn = await create_database(args.server, template)
        try:
            mixed = await mixed_runs(dsn, args.mixed_runs)
        finally:
            await _common.drop_database(args.server, dsn)
        dsns = {kind: await create_database(args.server, template) for kind in kinds}
        try:
            shares = await follower_cpu([(kind, dsn, ()) for kind, dsn in dsns.items()], args.cpu_seconds)
        finally:
            for dsn in dsns.values():
                await _common.drop_database(args.server, dsn)
    finally:
        await _common.drop_database(args.server, template)

    cpu = dict(zip(kinds, shares, strict=True))
    if args.skip_upstream:
        results["awa-pg"], cpu["awa-pg"] = {"sigkill": [float("nan")], "graceful": [float("nan")]}, float("nan")
    rows = [
        (f"SIGKILL takeover p50 ({args.runs} runs)", "sigkill", statistics.median, "s"),
        ("SIGKILL takeover p95", "sigkill", lambda v: _common.nearest_rank(v, 0.95), "s"),
        ("SIGKILL takeover max", "sigkill", max, "s"),
        (f"graceful handover p50 ({args.graceful_runs} runs)", "graceful", statistics.median, "s"),
        ("graceful handover max", "graceful", max, "s"),
    ]
    print("default settings for both; times from the signal to another holder in pg_locks")
    print(f"{'':<40}{'awa-pg 0.6.1':>14}{'awa_trio':>12}{'ratio':>9}")
    for label, key, reduce, _unit in rows:
        upstream, ours = reduce(results["awa-pg"][key]), reduce(results["awa_trio"][key])
        print(f"{label:<40}{upstream:>13.3f}s{ours:>11.3f}s{upstream / ours:>8.1f}x")
    print(f"{f'follower CPU, % of a core ({args.cpu_seconds:.0f} s)':<40}"
          f"{cpu['awa-pg'] * 100:>13.2f}%{cpu['awa_trio'] * 100:>11.2f}%"
          f"{(cpu['awa-pg'] / cpu['awa_trio']) if cpu['awa_trio'] else float('inf'):>8.1f}x")
    print("ratio = awa-pg / awa_trio (higher: awa_trio faster or cheaper); "
          f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("awa_trio SIGKILL takeovers, sorted (s): "
          + " ".join(f"{v:.3f}" for v in sorted(results["awa_trio"]["sigkill"])))
    if args.ha_runs:
        await print_ha(args.ha_runs)
    print(f"\nmixed fleet: awa-pg leader SIGKILLed, awa_trio follower takes over ({args.mixed_runs} runs): "
          f"p50 {statistics.median(mixed):.3f}s, p95 {_common.nearest_rank(mixed, 0.95):.3f}s, max {max(mixed):.3f}s")


if __name__ == "__main__":
    asyncio.run(main())
