"""Awa's own CLI (the ``awa`` binary of the awa-cli wheel, a test dependency):
its storage readiness report and its web UI's admin API."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import trio

#: The readiness part of ``awa storage status`` (awa-model's status_report).
READINESS_KEYS = (
    "state",
    "can_enter_mixed_transition",
    "enter_mixed_transition_blockers",
    "can_finalize",
    "finalize_blockers",
)


def awa_binary() -> str:
    """``awa`` beside this interpreter (the venv pip installed awa-cli into)."""
    beside = Path(sys.executable).parent / "awa"
    if beside.exists():
        return str(beside)
    found = shutil.which("awa")
    assert found, "the awa binary (pip install awa-cli==0.6.9, the test extra) is not installed"
    return found


async def storage_report(dsn: str) -> dict:
    """``awa storage status``: the state plus the readiness checks of enter-mixed and finalize."""
    result = await trio.run_process(
        [awa_binary(), "--database-url", dsn, "storage", "status"], capture_stdout=True, capture_stderr=True
    )
    return json.loads(result.stdout)


def readiness(report: dict) -> dict:
    return {key: report[key] for key in READINESS_KEYS}


def free_loopback_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class AwaServe:
    """``awa serve`` (Awa's web UI and admin API) on a loopback port."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> dict:
        import urllib.request

        def fetch() -> dict:
            with urllib.request.urlopen(self.base + path, timeout=5) as response:
                return json.loads(response.read())

        return await trio.to_thread.run_sync(fetch)

    async def runtime(self) -> dict:
        """GET /api/runtime: leader_instances, instances[] (pid, hostname, leader, maintenance_alive, stale ...)."""
        return await self.get("/api/runtime")


async def serve_admin_ui(dsn: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``awa serve`` on 127.0.0.1 until cancelled; reports an AwaServe once it answers."""
    import os
    import subprocess

    port = free_loopback_port()
    # --cache-ttl 0: every request reads the database (the default caches 5 s).
    argv = [awa_binary(), "--database-url", dsn, "serve", "--host", "127.0.0.1", "--port", str(port), "--cache-ttl", "0"]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ)
    )
    try:
        served = AwaServe(port)
        with trio.fail_after(30):
            while True:
                try:
                    await served.runtime()
                    break
                except OSError:
                    assert process.returncode is None, "awa serve exited"
                    await trio.sleep(0.1)
        task_status.started(served)
        await trio.sleep_forever()
    finally:
        process.kill()
        with trio.move_on_after(5, shield=True):
            await process.wait()
