"""The executor's status contracts (tests/status_contract.py) against the API emulator; the same run
against the real kube-apiserver in tests/integration/test_status_truth_real.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from lab.kubeapi import KubeAPIThread
from tests.status_contract import (
    a_status_agent_write_meanwhile_does_not_hold_the_status_back,
    a_status_decided_on_a_stale_read_is_requeued,
    refused_writes_are_said_in_the_status_once,
)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig") as a:
        yield a


def test_refused_writes_are_said_in_the_status_once(api: KubeAPIThread) -> None:
    anyio.run(refused_writes_are_said_in_the_status_once, api.kubeconfig, "tenant-refused")


def test_a_status_decided_on_a_stale_read_is_requeued(api: KubeAPIThread) -> None:
    anyio.run(a_status_decided_on_a_stale_read_is_requeued, api.kubeconfig, "tenant-stale")


def test_a_status_agent_write_meanwhile_does_not_hold_the_status_back(api: KubeAPIThread) -> None:
    anyio.run(a_status_agent_write_meanwhile_does_not_hold_the_status_back, api.kubeconfig, "tenant-agent")
