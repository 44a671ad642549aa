"""The one shape of a time Conflux writes into its files (status, lease, identity, stop
requests): ISO 8601 in UTC to the second, e.g. ``2026-11-27T09:47:14+00:00``."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def iso_utc(epoch: float | None = None) -> str:
    """``epoch`` (default: now) as an ISO 8601 UTC time, to the second."""
    return datetime.fromtimestamp(time.time() if epoch is None else epoch, UTC).isoformat(
        timespec="seconds"
    )


def epoch_of(iso: str) -> float | None:
    """The epoch of an ISO 8601 time; None if it is not one."""
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None
