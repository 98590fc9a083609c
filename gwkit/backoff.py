"""The one capped exponential backoff of the project (pure): how long to wait after N failures in a row.

``backoff(failures, base=..., cap=...)`` is 0 for no failure, then ``base``, ``2 base``, ``4 base`` ...
up to ``cap``, for any number of failures: a daemon that stays away for hours makes ``failures`` grow
without bound, and ``base * 2 ** failures`` computed naively stops being a float after 1,024 of them
(``OverflowError``: at the agent's 0.25 s reconnect cap that is about four minutes of charon being down).

Callers keep their own constants and their own sleep (injected, so tests run in zero time); this module
only decides. Users: the agent's VICI reconnect and tunnel re-initiation (``agent.ipsec.link``), its
Kubernetes status writer (``agent.sink``), the exporter's VICI reconnects (``exporter.sources``).
"""

from __future__ import annotations

import math


def backoff(failures: int, *, base: float, cap: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: ``min(cap, base * 2 ** (failures - 1))``,
    and 0.0 for ``failures <= 0``. Raises ValueError unless ``0 < base <= cap`` (finite)."""
    if not (0 < base <= cap and math.isfinite(cap)):
        raise ValueError(f"backoff: need 0 < base <= cap, finite (base={base!r}, cap={cap!r})")
    if failures <= 0:
        return 0.0
    doublings = failures - 1
    if doublings >= math.log2(cap / base):  # also keeps 2.0 ** doublings from overflowing
        return float(cap)
    return float(min(cap, base * 2.0**doublings))
