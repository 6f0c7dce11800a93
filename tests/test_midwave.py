"""SIGKILL of the leader mid-wave: 2,000 scheduled jobs come due at once
while two awa-pg 0.6.1 workers consume them; the awa_trio leader is killed
the moment the first promoted rows show (2,000 jobs are one promotion batch,
so the kill lands while the workers drain the wave) and an awa_trio
follower takes over. Every job completes
exactly once, at attempt 1, and none is left in any other state. The 20,000-
job version beside upstream's leaders is bench/bench_midwave.py."""

from __future__ import annotations

import logging

from support.midwave import run_wave

from awa_trio.db import open_database


async def test_sigkill_of_the_leader_mid_wave_every_job_completes_once_at_attempt_1(database_url, awa_client):
    async with open_database(database_url, pool_size=2, application_name="test admin") as admin:
        result = await run_wave(admin, awa_client, database_url, leaders="awa_trio", jobs=2_000,
                                kill_after=0.0, timeout=90)
    logging.getLogger(__name__).info(
        "promoted when killed %d of %d; takeover %.3f s; all completed %.2f s after due",
        result.promoted_at_kill, result.jobs, result.takeover, result.completion)
    assert result.unexpected_exits == []
    assert result.takeover < 3.0
    assert result.outcomes == {("completed", 1): 2_000}
    assert set(result.handler_runs) == set(result.job_ids)
    assert max(result.handler_runs.values()) == 1, "a job ran twice"
