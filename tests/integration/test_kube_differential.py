"""The differential suite: each scenario of tests/kube_differential.py against the real kube-apiserver
(lab.controlplane) and the API emulator (lab.kubeapi), the same observations required of both. A
difference that stays is written down in docs/kubeapi.md with why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from lab.controlplane import ControlPlane
from lab.kubeapi import KubeAPIThread
from tests.kube_differential import SCENARIOS, observe

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path_factory.mktemp("emulator") / "kubeconfig") as api:
        yield api


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_emulator_answers_as_the_real_server(
    scenario: str, controlplane: ControlPlane, emulator: KubeAPIThread
) -> None:
    ns = f"t-diff-{scenario.replace('_', '-')}"
    try:
        real = anyio.run(observe, controlplane.kubeconfig, scenario, ns)
    finally:
        controlplane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    emulated = anyio.run(observe, Path(emulator.kubeconfig), scenario, ns)
    diff = {
        k: {"real": real.get(k), "emulator": emulated.get(k)}
        for k in sorted(set(real) | set(emulated))
        if json.dumps(real.get(k), default=str) != json.dumps(emulated.get(k), default=str)
    }
    assert not diff, json.dumps(diff, indent=1, default=str)
