"""Logs: JSON lines with branch and term, no secret anywhere, one line per
failure episode instead of a traceback per retry."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from awa_trio.logs import JsonFormatter, SecretFilter, secrets_of

PASSWORD = "s3cr3t-Pa55"


def with_password(url: str, password: str = PASSWORD) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username or 'postgres'}:{password}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


def run_cli(*args: str, env: dict | None = None, seconds: float = 4.0) -> tuple[int, str]:
    """Run the CLI for a few seconds (then SIGINT); stdout+stderr."""
    process = subprocess.Popen([sys.executable, "-m", "awa_trio", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, **(env or {})))
    try:
        time.sleep(seconds)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out


async def test_json_lines_carry_branch_and_term(database_url):
    code, out = await trio.to_thread.run_sync(lambda: run_cli(
        "--database-url", database_url, "--log-format", "json", "--log-level", "DEBUG",
        "--promote-interval", "50ms", "--leader-election-interval", "200ms",
        "--periodic-job", "tick=* * * * *;kind=tick"))
    assert code == 0, out
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert records and len(records) == len([line for line in out.splitlines() if line.strip()]), out[:2000]
    assert all({"time", "level", "logger", "message", "branch"} <= set(r) for r in records)
    in_branches = {r["branch"] for r in records if r["branch"] and r.get("term") == 1}
    assert "cron_sync" in in_branches, [r for r in records if r["branch"]][:10]
    elected = [r for r in records if r["message"].startswith("elected maintenance leader")]
    assert elected and elected[0]["branch"] is None
    # Outside a term there is no term: the key is left out, never null.
    assert all(r["term"] is not None for r in records if "term" in r)
    assert any("term" not in r for r in records), out[:2000]


async def test_no_password_reaches_logs_errors_or_help(database_url):
    url = with_password(database_url)
    # Trust auth accepts any password, so the service runs; the password is
    # in the URL and in PGPASSWORD.
    code, out = await trio.to_thread.run_sync(lambda: run_cli(
        "--database-url", url, "--log-level", "DEBUG", env={"PGPASSWORD": "pg-Env-Secret"}))
    assert code == 0 and "elected maintenance leader" in out, out[-2000:]
    assert PASSWORD not in out and "pg-Env-Secret" not in out
    # An unreachable server: the error names the URL without its password.
    bad = with_password("postgresql://postgres@127.0.0.1:1/awa")
    failed = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "--database-url", bad], capture_output=True, text=True,
        timeout=60, env=dict(os.environ, PGPASSWORD="pg-Env-Secret")))
    assert failed.returncode == 1
    assert "postgres:***@127.0.0.1:1" in failed.stderr
    assert PASSWORD not in failed.stderr + failed.stdout
    helped = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "--help"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, AWA_DATABASE_URL=bad, PGPASSWORD="pg-Env-Secret")))
    assert PASSWORD not in helped.stdout and "pg-Env-Secret" not in helped.stdout


def test_secret_filter_scrubs_messages_and_tracebacks():
    scrubber = SecretFilter(secrets_of("postgresql://u:p%40ss@h/db", {"PGPASSWORD": "envpw"}))
    assert set(scrubber.secrets) == {"p@ss", "p%40ss", "envpw"}
    try:
        raise ValueError("could not connect with p@ss")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "dsn %s and %s", (
            "postgresql://u:p%40ss@h/db", "envpw"), sys.exc_info())
    scrubber.filter(record)
    text = JsonFormatter().format(record)
    assert "p@ss" not in text and "p%40ss" not in text and "envpw" not in text
    assert "postgresql://u:***@h/db" in text


def test_a_connection_episode_is_one_warning_and_one_recovery_line(caplog):
    from awa_trio.logs import CURRENT_BRANCH, ConnectionEpisodeFilter, connection_recovered

    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(ConnectionEpisodeFilter())
    logger = logging.getLogger("awa_trio.test")
    token = CURRENT_BRANCH.set("cleanup")
    try:
        for _ in range(50):
            logger.error("cleanup: step failed: [57P03] the database system is starting up")
        logger.error("cleanup: step failed: [42P01] relation does not exist")  # not connection trouble
        started = time.monotonic()
        logger.error("cleanup: step failed: [08006] connection lost")  # during the next body
        connection_recovered("cleanup", logger, since=started)  # that body failed: still open
        connection_recovered("cleanup", logger, since=time.monotonic())
        connection_recovered("cleanup", logger, since=time.monotonic())  # nothing open
    finally:
        CURRENT_BRANCH.reset(token)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.levelname for r in loud] == ["WARNING", "ERROR"]
    assert "[42P01]" in loud[1].getMessage()
    assert len(infos) == 1 and "after 51 failures" in infos[0].getMessage()


async def test_server_restart_is_one_episode_without_asyncpg_tracebacks(database_url, caplog):
    """Every pooled backend is terminated repeatedly (as a restarting server
    does): each branch logs one warning and one recovery, never a traceback."""
    from support.probes import BodyRecorder

    from awa_trio import MaintenanceConfig, MaintenanceService
    from awa_trio.db import open_database
    from awa_trio.logs import AsyncpgPoolNoiseFilter, ConnectionEpisodeFilter

    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(AsyncpgPoolNoiseFilter())
    caplog.handler.addFilter(ConnectionEpisodeFilter())

    async def mostly_in_flight(ctx, n):
        # A statement in flight most of the time, so that every termination
        # fails one (a quick statement may never be caught in flight).
        await ctx.db.fetchval("SELECT pg_sleep(0.03)")

    probe = BodyRecorder("in_flight", 0.02, mostly_in_flight)
    service = MaintenanceService(database_url, MaintenanceConfig(
        promote_interval=0.02, leader_election_interval=0.2, leader_check_interval=5),
        extra_branches=[probe.spec])
    async with open_database(database_url) as admin, trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.wait_until_leader()
        # Terminate what the branches use, not the term's start-up reads.
        with trio.fail_after(10):
            while "maintenance branches started" not in caplog.text:
                await trio.sleep(0.01)
        await trio.sleep(0.1)
        for _ in range(10):
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND application_name NOT LIKE '%lock' AND pid <> pg_backend_pid()")
            await trio.sleep(0.05)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    branch = [r for r in caplog.records if r.getMessage().startswith("in_flight")]
    warnings = [r for r in branch if r.levelno >= logging.WARNING]
    recovered = [r for r in branch if "connection works again" in r.getMessage()]
    # Ten terminations in half a second: at most one warning and one recovery
    # line per episode, never one per failed tick, never a traceback.
    assert 1 <= len(warnings) <= 10 and len(recovered) >= len(warnings) - 1
    assert all(r.levelno == logging.WARNING for r in warnings), [r.getMessage() for r in warnings]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]


async def test_every_outage_warns_once_again_after_the_election_reached_the_server(database_url, caplog):
    """Two outages of the server (through a proxy that closes every
    connection and refuses new ones), leadership regained in between: the
    failed term and election attempts of each outage are one warning, the
    second outage's included (the election used to leave its episode open
    for the process's life, and an aborted handshake was not recognised as
    connection trouble at all: a warning per attempt)."""
    from urllib.parse import urlsplit, urlunsplit

    from support.proxy import postgres_proxy

    from awa_trio import MaintenanceConfig, MaintenanceService
    from awa_trio.logs import AsyncpgPoolNoiseFilter, ConnectionEpisodeFilter

    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(AsyncpgPoolNoiseFilter())
    caplog.handler.addFilter(ConnectionEpisodeFilter())
    server = urlsplit(database_url)
    outages = []
    async with postgres_proxy(server.hostname or "localhost", server.port or 5432) as proxy:
        user = f"{server.username}@" if server.username else ""
        proxied = urlunsplit(server._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
        service = MaintenanceService(proxied, MaintenanceConfig(leader_election_interval=0.1,
                                                                 leader_check_interval=0.5))
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_until_leader()
            for _ in range(2):
                began = len(caplog.records)
                proxy.freeze()
                proxy.cut()
                with trio.fail_after(5):
                    await service.wait_until_follower()
                await trio.sleep(1.0)  # election attempts keep failing
                proxy.heal()
                with trio.fail_after(10):
                    await service.wait_until_leader()
                outages.append(caplog.records[began:])
            nursery.cancel_scope.cancel()
    for records in outages:
        failures = [r for r in records if r.name == "awa_trio.leadership" and r.getMessage().startswith(
            ("leader election attempt failed", "leadership term failed"))]
        loud = [r for r in failures if r.levelno >= logging.WARNING]
        assert len(failures) >= 3, "the election failed repeatedly in each outage"
        assert len(loud) == 1, [(r.levelname, r.getMessage()) for r in failures]


def test_a_recovery_line_names_its_logger_once(caplog):
    """The election's episode is keyed by its logger's name, which the log
    format already shows: the message must not repeat it."""
    from awa_trio.logs import ConnectionEpisodeFilter, connection_recovered

    logger = logging.getLogger("awa_trio.leadership")
    caplog.set_level(logging.INFO, logger="awa_trio.leadership")
    caplog.handler.addFilter(ConnectionEpisodeFilter())
    logger.warning("leader election attempt failed: connection refused")
    connection_recovered(logger.name, logger)
    [recovered] = [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]
    assert recovered.startswith("database connection works again after 1 failure in ")


def following_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "awa_trio.leadership" and r.getMessage().startswith("following:")]


async def test_a_follower_says_who_leads_once_and_again_when_the_leader_changes(database_url, caplog):
    """A follower polls the lock four times a second: one line on becoming
    a follower, one per new leader, naming the holder's backend pid and
    application_name, not one per poll."""
    from awa_trio import MaintenanceConfig, MaintenanceService, PeriodicJob

    caplog.set_level(logging.DEBUG)
    config = MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.5,
                               takeover_poll_interval=0.05)
    first = MaintenanceService(
        database_url, config, periodic_jobs=[PeriodicJob("tick", "* * * * * *", kind="tick")])
    others = [MaintenanceService(database_url, config) for _ in range(2)]

    async def wait_for(condition, what: str, seconds: float = 15) -> None:
        with trio.fail_after(seconds):
            while not condition():
                await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        with trio.fail_after(10):
            await first.wait_until_leader()
        leader_pid = first.lock_backend_pid
        for service in others:
            await nursery.start(service.run)
        await wait_for(lambda: len(following_lines(caplog)) >= 2, "both followers name the leader")
        await trio.sleep(1.0)  # 20 polls each: still one line per follower
        lines = [r.getMessage() for r in following_lines(caplog)]
        assert len(lines) == 2, lines
        assert all(re.match(
            rf"following: the maintenance lock is held by backend pid {leader_pid} "
            r"\(application_name 'awa_trio \S+:\d+ lock', from (127\.0\.0\.1|::1|a local socket)", line)
            for line in lines), lines
        assert all(r.levelno == logging.INFO for r in following_lines(caplog))

        first.stop()
        await wait_for(lambda: any(s.is_leader for s in others), "a follower takes over")
        [new_leader] = [s for s in others if s.is_leader]
        await wait_for(lambda: len(following_lines(caplog)) >= 3, "the other follower names the new leader")
        await trio.sleep(0.5)
        lines = [r.getMessage() for r in following_lines(caplog)]
        assert len(lines) == 3, lines
        assert f"held by backend pid {new_leader.lock_backend_pid} " in lines[2]
        nursery.cancel_scope.cancel()

    # The cron schedule fired every second; each fire is a DEBUG line, not INFO.
    fires = [r for r in caplog.records if "enqueued periodic job 'tick'" in r.getMessage()]
    assert fires and all(r.levelno == logging.DEBUG for r in fires)


async def test_an_outage_is_one_warning_then_reminders_at_growing_intervals_then_one_info(
    caplog, autojump_clock, trio_time_records
):
    """Whatever the error says (the connection-trouble patterns are not
    needed): a failure every second for 200 s is 1 warning, reminders at
    10, 30, 70 and 150 s, debug lines between, and one line at recovery."""
    from awa_trio.logs import ConnectionEpisodeFilter, OutageLog

    logger = logging.getLogger("awa_trio.leadership")
    caplog.set_level(logging.DEBUG, logger="awa_trio.leadership")
    caplog.handler.addFilter(ConnectionEpisodeFilter())
    outage = OutageLog(logger, "leader election attempt")
    began = trio.current_time()
    for _ in range(200):
        outage.failed("OSError: Multiple exceptions: [Errno 111] Connect call failed ('::1', 5432, 0, 0)")
        await trio.sleep(1)
    outage.recovered()
    loud = [(round(r.created_trio - began), r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert [at for at, _ in loud] == [0, 10, 30, 70, 150], loud
    assert loud[0][1].startswith("leader election attempt failed: OSError: Multiple exceptions")
    assert loud[1][1].startswith("leader election attempt still failing after 10s (11 attempts): OSError")
    [back] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert back == "leader election attempt works again after 200.0s (200 failed attempts)"
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 195
    outage.failed("again")  # the next outage warns at once
    assert caplog.records[-1].levelno == logging.WARNING


@pytest.fixture
def trio_time_records():
    """Each log record carries the Trio clock's time as ``created_trio``."""
    factory = logging.getLogRecordFactory()

    def stamped(*args, **kwargs):
        record = factory(*args, **kwargs)
        try:
            record.created_trio = trio.current_time()
        except RuntimeError:
            record.created_trio = None
        return record

    logging.setLogRecordFactory(stamped)
    yield
    logging.setLogRecordFactory(factory)


async def test_while_the_server_is_unreachable_status_gives_the_reason_readyz_gives(database_url, caplog):
    """The election's outage is one warning however long it lasts, and a
    follower's /status says why it does not lead, in /readyz's words."""
    import json
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit, urlunsplit

    from support.proxy import postgres_proxy

    from awa_trio import MaintenanceConfig, MaintenanceService
    from awa_trio.logs import ConnectionEpisodeFilter

    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(ConnectionEpisodeFilter())
    server = urlsplit(database_url)

    def get(url: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    async with trio.open_nursery() as nursery:
        async with postgres_proxy(server.hostname or "localhost", server.port or 5432) as proxy:
            user = f"{server.username}@" if server.username else ""
            proxied = urlunsplit(server._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
            service = MaintenanceService(
                proxied, MaintenanceConfig(leader_election_interval=0.1, leader_check_interval=0.5),
                http_address="127.0.0.1:0")
            await nursery.start(service.run)
            await service.wait_until_leader()
            [url] = service.http_urls
            began = len(caplog.records)
            proxy.freeze()
            proxy.cut()
        # The proxy is gone: every connection is refused from now on.
        with trio.fail_after(5):
            await service.wait_until_follower()
        await trio.sleep(3)
        ready_code, ready = await trio.to_thread.run_sync(get, url + "/readyz")
        status_code, status = await trio.to_thread.run_sync(get, url + "/status")
        nursery.cancel_scope.cancel()
    assert ready_code == 503 and status_code == 200
    assert status["role"] == "follower"
    assert status["not_leading_reason"] == ready["reason"] and "Connect call failed" in ready["reason"]
    election = [r for r in caplog.records[began:] if r.name == "awa_trio.leadership"
                and r.getMessage().startswith("leader election attempt")]
    assert len(election) >= 3, [r.getMessage() for r in election]
    assert sum(r.levelno >= logging.WARNING for r in election) == 1, [
        (r.levelname, r.getMessage()) for r in election]
