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
