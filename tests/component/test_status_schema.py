"""Every writer's full status survives the emulator's structural-schema pruning (tests/status_schema.py);
the same run against the real kube-apiserver is tests/integration/test_status_schema_real.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from lab.kubeapi import KubeAPIThread
from tests.status_schema import round_trips


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig") as a:
        yield a


def test_nothing_a_writer_puts_in_status_is_pruned(api: KubeAPIThread) -> None:
    written = anyio.run(round_trips, api.kubeconfig, "tenant-status")
    assert len([k for k in written if not k.startswith("VPNPeer/")]) == 3
    assert sorted(k for k in written if k.startswith("VPNPeer/")) == [
        "VPNPeer/branch",
        "VPNPeer/hq",
        "VPNPeer/laptop-b",
        "VPNPeer/laptop-c",
        "VPNPeer/site-a",
    ]
