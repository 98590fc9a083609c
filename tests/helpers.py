"""Small helpers more than one test module needs, kept once here (fixtures the integration modules share
are in tests/integration/conftest.py; polling is lab.wait)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any

from lab import netns


def conditions(gw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A custom resource's status conditions by type (none yet: empty)."""
    return {c["type"]: c for c in (gw.get("status") or {}).get("conditions") or []}


def condition(gw: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type ``kind``; empty (falsy, for a wait) while the resource has none."""
    return dict(conditions(gw).get(kind) or {})


def conntrack(ns: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``conntrack`` in network namespace ``ns``; the caller checks the return code."""
    return netns.run(netns.ns_exec(ns, "conntrack", *args), check=False)
