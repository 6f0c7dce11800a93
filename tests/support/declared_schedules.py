"""An application's schedules, declared once in code for awa-pg and awa_trio.

``declare(client)`` covers every way awa-pg 0.6.1 derives a kind and
serialises args: a dataclass, a pydantic-style model (``model_dump``), a
dict, nested plain objects (``__dict__``), Decimal, IntEnum, NaN and an int
past 64 bits. ``declare_probe`` is a per-second schedule whose expression
and args come from the environment, so a test can change them.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from decimal import Decimal

PROBE_KIND = "declared_probe"
PROBE_QUEUE = "declaredq"


@dataclasses.dataclass
class NightlyReport:
    format: str
    pages: int = 3
    ratio: float = 0.5
    recipients: list = dataclasses.field(default_factory=lambda: ["ops@example.com"])
    options: dict = dataclasses.field(default_factory=lambda: {"draft": False, "limit": None})


class SMTPDigest:
    """Duck-typed like a pydantic model: awa-pg calls model_dump(mode="json")."""

    def __init__(self, to):
        self.to = to

    def model_dump(self, mode="python"):
        return {"to": self.to, "mode": mode}


class Level(enum.IntEnum):
    HIGH = 3


class Window:
    def __init__(self):
        self.start = "02:00"
        self.hours = 2


class HTMLToPDF:
    pass


@dataclasses.dataclass
class DeclaredProbe:
    version: int


def declare(client):
    client.periodic(
        "report_nightly",
        "30 2 * * *",
        NightlyReport,
        NightlyReport("pdf"),
        timezone="Europe/London",
        queue="reports",
        priority=3,
        max_attempts=5,
        tags=["reports", "nightly"],
        metadata={"team": "ops", "depth": {"a": [1, 2.5, None]}},
        missed_fire_policy="catch_up",
    )
    client.periodic("digest_hourly", "0 * * * *", SMTPDigest, SMTPDigest(["a@example.com"]))
    client.periodic(
        "odd_values",
        "0 15 4 * * 1-5",
        HTMLToPDF,
        {
            "dec": Decimal("1.25"),
            "big": 2**70,
            "nan": float("nan"),
            "level": Level.HIGH,
            "window": Window(),
            "text": "ü ✓",
            "flag": True,
        },
        tags=("a",),
        metadata=None,
        timezone="America/New_York",
    )


def declare_probe(client):
    client.periodic(
        "declared_probe",
        os.environ.get("DECLARED_PROBE_EXPR", "* * * * * *"),
        DeclaredProbe,
        DeclaredProbe(int(os.environ.get("DECLARED_PROBE_VERSION", "1"))),
        queue=PROBE_QUEUE,
        tags=["declared"],
    )
