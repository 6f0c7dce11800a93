"""The planes of a staged transition into queue storage: queue storage
first, then the canonical rows still draining (one body serves both)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...maintenance.planes import Planes, RunOnce, serve_planes


@dataclasses.dataclass
class PlaneResults(Planes):
    """What one both-planes pass did on each plane (None: that plane failed)."""

    queue_storage: Any
    canonical: Any


def both_planes(name: str, queue_storage_pass: RunOnce, canonical_pass: RunOnce) -> RunOnce:
    """One body that serves both planes (see :func:`serve_planes`)."""
    return serve_planes(name, PlaneResults, queue_storage_pass, canonical_pass)
