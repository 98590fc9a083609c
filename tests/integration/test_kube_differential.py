"""The differential suite: each scenario of tests/kube_differential.py against the real kube-apiserver
(lab.controlplane) and the API emulator (lab.kubeapi), the same observations required of both. A
difference that stays is written down in docs/kubeapi.md with why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    diff = differences(json.loads(json.dumps(real)), json.loads(json.dumps(emulated)))
    assert not diff, "\n".join(f"{path}: real {r!r}, emulator {e!r}" for path, r, e in diff)


def differences(real: Any, emulated: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, real, emulated) of every leaf where the two differ (key order aside)."""
    if isinstance(real, dict) and isinstance(emulated, dict):
        return [
            d
            for k in sorted(set(real) | set(emulated))
            for d in differences(real.get(k, "<absent>"), emulated.get(k, "<absent>"), f"{path}/{k}")
        ]
    if isinstance(real, list) and isinstance(emulated, list) and len(real) == len(emulated):
        return [
            d
            for i, (r, e) in enumerate(zip(real, emulated, strict=True))
            for d in differences(r, e, f"{path}[{i}]")
        ]
    return [] if real == emulated else [(path or "/", real, emulated)]
