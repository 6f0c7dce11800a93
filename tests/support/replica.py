"""A throwaway primary and streaming hot standby, for failover tests.

Both live in one temporary directory, listen on loopback ports of their own
and run PostgreSQL's own binaries (``initdb``, ``pg_ctl``,
``pg_basebackup -R``) as the ``postgres`` system user when the tests run as
root (initdb refuses root). Nothing outside the directory is touched, and
both servers are stopped and the directory removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def postgres_bin_dir() -> Path | None:
    """The newest installed server's bin directory (Debian layout), or None."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return candidates[-1].parent if candidates else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, cluster: ReplicaCluster, name: str, port: int):
        self.cluster = cluster
        self.name = name
        self.port = port
        self.data = cluster.root / name

    @property
    def server_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def url(self, database: str = "postgres") -> str:
        return f"{self.server_url}/{database}"

    def start(self) -> None:
        self.cluster.run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.cluster.root / f"{self.name}.log"), "-w", "-t", "60",
            "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.cluster.root}",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.cluster.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def promote(self) -> None:
        self.cluster.run("pg_ctl", "-D", str(self.data), "-w", "promote")


class ReplicaCluster:
    """``primary`` and ``standby`` (streaming from it, ``pg_basebackup -R``)."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="awa_trio_ha_"))
        self.as_root = os.geteuid() == 0
        if self.as_root:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.primary = Server(self, "primary", free_port())
        self.standby = Server(self, "standby", free_port())

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / program), *args]
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120, cwd=self.root)

    def create(self) -> None:
        self.run("initdb", "-D", str(self.primary.data), "-U", "postgres", "--auth=trust", "--no-sync")
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.write("fsync = off\nsynchronous_commit = off\nwal_level = replica\nmax_wal_senders = 4\n")
        self.primary.start()
        self.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                 "-D", str(self.standby.data), "-R", "-X", "stream", "--no-sync")
        self.standby.start()
        wait_for_replay(self)

    def close(self) -> None:
        for server in (self.standby, self.primary):
            if server.data.exists():
                server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def wait_for_replay(cluster: ReplicaCluster, timeout: float = 30.0) -> None:
    """Until the standby accepts connections (in recovery)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cluster.run("pg_isready", "-h", "127.0.0.1", "-p", str(cluster.standby.port), check=False)
        if result.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("the standby did not come up")


@contextlib.contextmanager
def replica_cluster() -> Iterator[ReplicaCluster]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) installed")
    cluster = ReplicaCluster(bin_dir)
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.close()
