"""A throwaway PgBouncer in front of the test server, for pooler tests.

Debian's package and its defaults, except what a test must set: where it
listens (loopback, a free port), where it forwards (every database to the
test server), trust authentication, and the pool mode. Notably
``ignore_startup_parameters`` is left unset, as a user's would be. PgBouncer
refuses to run as root, so it runs as the ``postgres`` system user then.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from support.replica import free_port


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(path)), None
    )


class PgBouncer:
    def __init__(self, root: Path, port: int):
        self.root = root
        self.port = port

    def url(self, direct_url: str) -> str:
        """``direct_url`` with its host and port replaced by the pooler's."""
        parts = urllib.parse.urlsplit(direct_url)
        user = f"{parts.username}@" if parts.username else ""
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))


@contextlib.contextmanager
def pgbouncer(server_dsn: str, pool_mode: str) -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed")
    server = urllib.parse.urlsplit(server_dsn)
    root = Path(tempfile.mkdtemp(prefix="awa_trio_pgbouncer_"))
    port = free_port()
    (root / "users.txt").write_text(f'"{server.username or "postgres"}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    as_user: dict[str, int] = {}
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        for path in (root, *root.iterdir()):
            os.chown(path, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    # Started directly (not through runuser), so that the signal below reaches it.
    process = subprocess.Popen(
        [binary, str(root / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **as_user
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                log = (root / "pgbouncer.log").read_text() if (root / "pgbouncer.log").exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {log[-500:]}")
            time.sleep(0.05)
        yield PgBouncer(root, port)
    finally:
        process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)
