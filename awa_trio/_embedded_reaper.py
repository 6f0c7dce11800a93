"""The clean-up of last resort for :mod:`awa_trio.embedded`.

A process that started a throwaway server can die without stopping it: a
SIGTERM with Python's default handler, a SIGKILL, a crash. This watcher,
started first and in a session of its own (a terminal's Ctrl-C does not
reach it), outlives its owner for exactly that case: when its standard input
ends without ``done``, it stops every process it was told of and removes the
server's directory. It runs as a plain script (no package import, standard
library only) so that it starts in milliseconds.

    python _embedded_reaper.py DIRECTORY    # stdin: "pid N" lines, then "done"
"""

import os
import shutil
import signal
import sys
import time

#: How long the server gets for a fast shutdown before it is killed.
GRACE = 3.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def main() -> None:
    directory = sys.argv[1]
    pids: list[int] = []
    for line in sys.stdin:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return
        if word == "pid":
            pids.append(int(value))
    # The owner is gone without cleaning up: a fast shutdown (SIGINT for
    # postgres; initdb removes its work and exits), then SIGKILL for what
    # is left, the server's backends included (its own process group).
    for pid in pids:
        send(pid, signal.SIGINT)
    deadline = time.monotonic() + GRACE
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            send(pid, signal.SIGKILL)
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline + GRACE:
        time.sleep(0.05)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
