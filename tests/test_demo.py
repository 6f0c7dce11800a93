"""``python -m awa_trio demo``: a throwaway PostgreSQL, awa_trio leading, a
real awa-pg workload; it says what maintenance did, only what the database
shows, and cleans up, at the end or at Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio


def demo_directory() -> Path:
    # The demo's server lives in a temporary directory of our own, so that
    # another run on this machine cannot confuse the clean-up check. (Not
    # pytest's tmp_path: run as root, the server runs as nobody, who must be
    # able to reach it.)
    path = Path(tempfile.mkdtemp(prefix="awa_trio_demo_test_"))
    path.chmod(0o755)
    return path


def interruptible() -> None:
    """For Popen's preexec_fn: SIGINT as a terminal gives it. A shell runs a
    background job (CI's second suite) with SIGINT ignored, which its
    children inherit; Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (entry / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if text in cmdline and "zombie" not in state:
            found.append(cmdline)
    return found


@pytest.mark.parametrize("engine", ["queue_storage", "canonical"])
async def test_the_demo_shows_promotion_rescue_and_cron_then_cleans_up(engine):
    tmp_path = demo_directory()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "demo", "--engine", engine, "--duration", "20s",
         "--metrics-addr", "127.0.0.1:0", "--log-level", "WARNING"],
        capture_output=True, text=True, timeout=240, env=env))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "awa_trio is the maintenance leader; endpoints: http://127.0.0.1:" in out
    # The engine as awa.storage_status() has it, and the one asked for.
    if engine == "queue_storage":
        assert ("the database runs on queue storage, Awa 0.6's default engine (awa.storage_status(): "
                "engine queue_storage, state active)") in out, out
    else:
        assert "the database runs on the canonical engine (awa.storage_status(): engine canonical" in out, out
    assert "storage changed" not in out and "did not happen" not in out, out
    assert re.search(r"promotion: send_email job \d+ came due", out), out
    # Rescues: exactly the one the leader made (its WARNING line counts the
    # jobs each sweep rescued), of the job whose worker was killed, told
    # no earlier than the moment its row records.
    rescues = re.findall(
        r"^\[(\d\d:\d\d:\d\d)\] rescue: (\w+) job (\d+): its worker stopped heartbeating \(it was killed\); "
        r"at (\d\d:\d\d:\d\d) the leader's heartbeat rescue took attempt 1 back", out, re.M)
    rescued = sum(int(n) for n in re.findall(r"rescue_stale_heartbeats: rescued (\d+)", result.stderr))
    assert len(rescues) == rescued == 1, out + result.stderr[-3000:]
    [(told_at, kind, job_id, happened_at)] = rescues
    assert kind == "slow_report" and told_at >= happened_at
    assert re.search(rf"slow_report job {job_id} completed on attempt 2: nothing was lost", out), out
    assert len(re.findall(r"\] rescue: ", out)) == 1, out
    fires = int(re.search(r"demo over: cron fired (\d+) times", out).group(1))
    assert fires >= 10, out
    assert "stopping PostgreSQL and removing its files" in out
    leftovers = list(tmp_path.glob("awa_trio_pg_*"))
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert leftovers == []


async def test_ctrl_c_stops_the_demo_in_seconds_and_leaves_no_server_or_worker():
    """Ctrl-C reaches the whole foreground process group (the demo and its
    workers; the server has a session of its own): the demo says it is
    stopping, exits 0 within seconds and no postgres or worker is left."""
    tmp_path = demo_directory()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "awa_trio", "demo", "--metrics-addr", "127.0.0.1:0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True,
        preexec_fn=interruptible)
    out = ""
    try:
        deadline = time.monotonic() + 120
        assert process.stdout is not None
        while "starting a replacement worker" not in out:  # workers and server clients all up
            assert time.monotonic() < deadline, out
            line = await trio.to_thread.run_sync(process.stdout.readline)
            assert line, out
            out += line
        url = re.search(r"into (postgresql://\S+) \.\.\.", out).group(1)
        assert processes_mentioning(str(tmp_path)) and processes_mentioning(url)
        interrupted = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        rest, _ = await trio.to_thread.run_sync(lambda: process.communicate(timeout=30))
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    out += rest
    assert process.returncode == 0, out
    assert took < 8, f"Ctrl-C took {took:.1f}s\n{out}"
    assert "Ctrl-C: stopping the workers and the leader" in out
    assert "stopping PostgreSQL and removing its files" in out
    assert processes_mentioning(str(tmp_path)) == []  # postgres -D <tmp>/awa_trio_pg_*/data
    assert processes_mentioning(url) == []  # the awa-pg workers
    leftovers = list(tmp_path.glob("awa_trio_pg_*"))
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert leftovers == []


def processes_of_this_run(tmp_path: Path) -> list[str]:
    """Live processes of one demo run: the server (its data directory is in
    its command line), the reaper (likewise) and anything that inherited the
    run's TMPDIR (the awa-pg workers)."""
    marker = f"TMPDIR={tmp_path}".encode()
    found = processes_mentioning(str(tmp_path))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(cmdline)
    return found


#: When the signal comes: seconds after launch, or the line the demo prints
#: as it enters a phase.
MOMENTS = {
    "0.2s": 0.2,
    "0.5s": 0.5,
    "1s": 1.0,
    "2s": 2.0,
    "schema install": "installing the Awa schema with awa-pg",
    "queue-storage finalisation": "switching the new database to queue storage",
    "workload": "is scheduled for",
}


@pytest.mark.parametrize(
    ("moment", "signum"),
    [
        ("0.2s", signal.SIGTERM),
        ("0.5s", signal.SIGINT),
        ("1s", signal.SIGTERM),
        ("2s", signal.SIGINT),
        ("schema install", signal.SIGTERM),
        ("queue-storage finalisation", signal.SIGINT),
        ("workload", signal.SIGINT),
        ("workload", signal.SIGTERM),
    ],
    ids=lambda value: value if isinstance(value, str) else signal.Signals(value).name,
)
async def test_a_signal_at_any_moment_stops_the_demo_and_leaves_nothing_behind(moment, signum):
    """SIGINT or SIGTERM to the demo process alone (not its group: the demo
    itself must stop its workers and server), at any moment of its life:
    exit 0 within 5 s, and no process and no directory of the run left."""
    tmp_path = demo_directory()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    launched = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "awa_trio", "demo", "--metrics-addr", "127.0.0.1:0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        preexec_fn=interruptible)
    out = ""
    try:
        when = MOMENTS[moment]
        if isinstance(when, float):
            await trio.sleep(max(0.0, launched + when - time.monotonic()))
        else:
            assert process.stdout is not None
            deadline = time.monotonic() + 120
            while when not in out:
                assert time.monotonic() < deadline, out
                line = await trio.to_thread.run_sync(process.stdout.readline)
                assert line, out
                out += line
        signalled = time.monotonic()
        process.send_signal(signum)
        try:
            rest, errors = await trio.to_thread.run_sync(lambda: process.communicate(timeout=30))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not exit 30 s after {signal.Signals(signum).name}\n{out}")
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    out += rest
    if process.returncode == -signum:
        # Before the interpreter reached awa_trio's first line (a loaded
        # machine can take over 0.2 s to start Python), the signal's own
        # action ends it: then nothing of the demo exists yet.
        assert out == "" and isinstance(MOMENTS[moment], float), out + errors[-3000:]
    else:
        assert process.returncode == 0, out + errors[-3000:]
    assert "Traceback" not in errors, errors[-3000:]
    assert took < 5, f"{signal.Signals(signum).name} at {moment}: exit took {took:.1f}s\n{out}"
    # Workers killed by the demo are gone in a moment; nothing else may be left.
    deadline = time.monotonic() + 3
    while processes_of_this_run(tmp_path) and time.monotonic() < deadline:
        await trio.sleep(0.1)
    leftovers = list(tmp_path.iterdir())
    left_running = processes_of_this_run(tmp_path)
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert left_running == [], out
    assert leftovers == [], out


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands PostgreSQL to another user")
async def test_a_temporary_directory_the_server_user_cannot_enter_is_one_line_and_leaves_nothing():
    closed = Path(tempfile.mkdtemp(prefix="awa_trio_demo_closed_"))  # mode 0700
    try:
        result = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "awa_trio", "demo", "--metrics-addr", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "TMPDIR": str(closed)}))
        leftovers = list(closed.iterdir())
    finally:
        shutil.rmtree(closed, ignore_errors=True)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr == (
        f"awa_trio: {closed} is closed to the user nobody, who runs PostgreSQL when this runs as root: "
        "point TMPDIR at a directory others may enter\n")
    assert leftovers == []
