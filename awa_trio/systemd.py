"""The systemd notification protocol (``sd_notify(3)``), without libsystemd.

Under ``Type=notify`` (deploy/systemd/awa-trio.service) systemd waits for
``READY=1`` before it counts the service started, shows ``STATUS=`` in
``systemctl status``, takes ``STOPPING=1`` as the start of a clean stop, and
with ``WatchdogSec=`` restarts a process whose ``WATCHDOG=1`` pings stop.
Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)


def notify(*assignments: str) -> bool:
    """Send ``assignments`` (``"READY=1"``, ``"STATUS=..."``) to the service
    manager; False when there is none or it cannot be reached (logged)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(assignments).encode())
    except OSError as exc:
        log.warning("cannot notify the service manager at NOTIFY_SOCKET: %s", exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Half of ``WatchdogSec`` (systemd's advice), if it is set for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


async def keep_watchdog_fed(alive: Callable[[], bool], interval: float) -> None:
    """Ping every ``interval`` while ``alive()`` says the service works
    (its database answers, its tasks run): a wedged process is restarted."""
    while True:
        if alive():
            notify("WATCHDOG=1")
        await trio.sleep(interval)
