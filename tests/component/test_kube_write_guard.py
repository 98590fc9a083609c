"""The controller's client sends no write once its guard (``LeaderElector.leads``) says no: reads go on,
and the API server never sees the write (the emulator's request log)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from gwkit.kube import Fenced, KubeClient, load
from gwkit.kube.client import CONFIGMAPS
from lab.kubeapi import KubeAPIThread


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig") as a:
        yield a


def test_a_fenced_client_reads_but_sends_no_write(api: KubeAPIThread) -> None:
    leading = [True]
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "plan", "namespace": "default"},
    }

    async def scenario() -> None:
        async with KubeClient(load(api.kubeconfig), write_guard=lambda: leading[0]) as kube:
            await kube.create(CONFIGMAPS, cm, "default")
            leading[0] = False
            mark = len(api.requests(writes_only=True))
            for write in (
                kube.create(CONFIGMAPS, {**cm, "metadata": {**cm["metadata"], "name": "other"}}, "default"),
                kube.patch(CONFIGMAPS, "plan", {"data": {"k": "v"}}, "default"),
                kube.delete(CONFIGMAPS, "plan", "default"),
            ):
                with pytest.raises(Fenced, match="no longer leads"):
                    await write
            assert len(api.requests(writes_only=True)) == mark, "nothing reached the API server"
            got = await kube.get(CONFIGMAPS, "plan", "default")
            assert "data" not in got, "reads go on, the patch never happened"

    anyio.run(scenario)
