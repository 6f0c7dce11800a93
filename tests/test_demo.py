"""``python -m awa_trio demo``: a throwaway PostgreSQL, awa_trio leading, a
real awa-pg workload; it says what maintenance did and cleans up."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio


@pytest.mark.parametrize("engine", ["queue_storage"])
async def test_the_demo_shows_promotion_rescue_and_cron_then_cleans_up(engine):
    # The demo's server lives in a temporary directory of our own, so that
    # another run on this machine cannot confuse the clean-up check. (Not
    # pytest's tmp_path: run as root, the server runs as nobody, who must be
    # able to reach it.)
    tmp_path = Path(tempfile.mkdtemp(prefix="awa_trio_demo_test_"))
    tmp_path.chmod(0o755)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "awa_trio", "demo", "--engine", engine, "--duration", "20",
         "--metrics-addr", "127.0.0.1:0", "--log-level", "WARNING"],
        capture_output=True, text=True, timeout=240, env=env))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "awa_trio is the maintenance leader; endpoints: http://127.0.0.1:" in out
    assert re.search(r"promotion: send_email job \d+ came due", out), out
    assert re.search(r"rescue: slow_report job \d+'s worker stopped heartbeating", out), out
    assert re.search(r"slow_report job \d+ completed on attempt 2", out), out
    fires = int(re.search(r"demo over: cron fired (\d+) times", out).group(1))
    assert fires >= 10, out
    assert "stopping PostgreSQL and removing its files" in out
    leftovers = list(tmp_path.glob("awa_trio_pg_*"))
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert leftovers == []
