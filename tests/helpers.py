"""Small helpers more than one test module needs, kept once here (fixtures the integration modules share
are in tests/integration/conftest.py; polling is lab.wait)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Mapping
from typing import Any

from gwkit.kube import KubeClient, NotFound, Resource
from lab import netns
from lab.wait import wait_for_async


def conditions(gw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A custom resource's status conditions by type (none yet: empty)."""
    return {c["type"]: c for c in (gw.get("status") or {}).get("conditions") or []}


def condition(gw: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type ``kind``; empty (falsy, for a wait) while the resource has none."""
    return dict(conditions(gw).get(kind) or {})


def conntrack(ns: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``conntrack`` in network namespace ``ns``; the caller checks the return code."""
    return netns.run(netns.ns_exec(ns, "conntrack", *args), check=False)


async def create_when_served(
    kube: KubeClient, res: Resource, doc: Mapping[str, Any], namespace: str
) -> dict[str, Any]:
    """``doc`` (a copy, in ``namespace``) created once its endpoint is served: a CRD's resource answers
    NotFound for a moment after the CRD is Established, on the real server and the emulator alike."""
    body = copy.deepcopy(dict(doc))
    body["metadata"]["namespace"] = namespace
    created: dict[str, Any] = await wait_for_async(
        lambda: kube.create(res, body, namespace),
        30,
        f"the {res.kind} created (once its endpoint is served)",
        interval=0.2,
        ignoring=(NotFound,),
    )
    return created
