"""Drive awa-pg worker processes from Trio tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import trio

WORKER_SCRIPT = Path(__file__).with_name("awa_pg_worker.py")


class WorkerProcess:
    """An awa-pg runtime in a child process; its stdout lines are collected."""

    def __init__(self, process: trio.Process):
        self.process = process
        self.lines: list[str] = []
        self._new_line = trio.Event()

    async def _read(self) -> None:
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.lines.append(line.decode())
                self._new_line.set()
                self._new_line = trio.Event()

    async def wait_for_line(self, prefix: str, timeout: float = 20.0) -> str:
        """The first line (seen so far or later) starting with prefix."""
        with trio.fail_after(timeout):
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if self.process.returncode is not None:
                    raise RuntimeError(
                        f"awa-pg worker exited ({self.process.returncode}) before {prefix!r}: "
                        f"{self.lines}"
                    )
                await self._new_line.wait()

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-job, as in a crash."""
        self.process.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)


@asynccontextmanager
async def worker_process(argv: list[str], *, env: dict[str, str] | None = None, graceful: float = 0.0):
    """A child awa-pg runtime started from ``argv``, yielded once it prints
    READY; at the end it is killed, or with ``graceful`` first sent SIGTERM
    and given that many seconds to shut down."""
    env = env if env is not None else dict(os.environ, PYTHONUNBUFFERED="1")
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=None, env=env)
        worker = WorkerProcess(process)
        nursery.start_soon(worker._read)
        try:
            await worker.wait_for_line("READY", timeout=30)
            yield worker
        finally:
            if process.returncode is None:
                if graceful:
                    process.terminate()
                else:
                    process.kill()
            with trio.move_on_after(graceful or 5, shield=True):
                await process.wait()
            if process.returncode is None:
                process.kill()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def awa_pg_worker(dsn: str, *kinds: str, behaviour: str = "complete", extra_args=()):
    """Start a worker, wait for READY, yield it; kill it on exit."""
    argv = [sys.executable, str(WORKER_SCRIPT), dsn, "--behaviour", behaviour]
    for kind in kinds:
        argv += ["--kind", kind]
    argv += list(extra_args)
    async with worker_process(argv) as worker:
        yield worker
