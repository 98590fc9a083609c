"""Every writer's full status survives the REAL kube-apiserver's structural-schema pruning (lab.controlplane,
v1.35): the controller's, the IPsec and WireGuard status-agents' and init-nat's, each as its own code builds
it and written as it writes it (tests/status_schema.py; the emulator run is
tests/component/test_status_schema.py)."""

from __future__ import annotations

import anyio
import pytest

from lab.controlplane import ControlPlane
from tests.status_schema import round_trips

pytestmark = pytest.mark.lab


def test_nothing_a_writer_puts_in_status_is_pruned(controlplane: ControlPlane) -> None:
    try:
        written = anyio.run(round_trips, controlplane.kubeconfig, "t-status-schema")
    finally:
        controlplane.kubectl("delete", "namespace", "t-status-schema", "--wait=false", check=False)
    assert len([k for k in written if not k.startswith("VPNPeer/")]) == 3
    assert sorted(k for k in written if k.startswith("VPNPeer/")) == [
        "VPNPeer/branch",
        "VPNPeer/hq",
        "VPNPeer/laptop-b",
        "VPNPeer/laptop-c",
        "VPNPeer/site-a",
    ]
