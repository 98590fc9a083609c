"""A failover as the gateway CR sees it (``agent.sink.StatusGate``): two pods' status writers, each with its
own user, write the same VPNGateway on the API emulator. Only the active one writes; the fenced one never
writes again (a write of its in flight at the fence is cancelled, its later ``Standby``/``Down`` stay held),
so the new active's ``Established`` is what the CR says. The roles are flipped by hand (``ManualRole``): the
elector's own order (fenced before the other is active) is tests/component/test_agent_ha.py's."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.fakes import ManualRole
from agent.sink import KubeStatusApi, KubeStatusSink, StatusGate
from controller.api.crds import crds
from gwkit.kube import KubeClient, load
from lab.kubeapi import KubeAPI
from lab.wait import wait_for_async
from tests.component.test_agent_runtime import GW, GW_DOC

pytestmark = pytest.mark.anyio

VPN = "vpn.bnerd.net/v1alpha1"


def status(state: str, pod: str) -> dict[str, Any]:
    return {"tunnels": [{"name": "s1", "state": state}], "agent": {"daemon": pod}}


class Pod:
    def __init__(self, api: KubeAPI, tmp: Path, name: str, role: ManualRole) -> None:
        self.name = name
        self.role = role
        token = api.user_token(name, ("system:masters",))
        self.kube = KubeClient(
            load(api.write_kubeconfig(tmp / f"{name}.kubeconfig", token, "tenant-a", name))
        )
        self.gate = StatusGate(role)
        self.sink = KubeStatusSink(GW, KubeStatusApi(self.kube), min_interval=0.2, gate=self.gate)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.gate.follow)
            await self.sink.run()


async def test_the_fenced_pod_never_writes_over_the_new_actives_status(tmp_path: Path) -> None:
    async with KubeAPI(workdir=tmp_path / "api") as api:
        for crd in crds():
            api.create(crd)
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-a"}})
        api.create(copy.deepcopy(GW_DOC))

        def cr() -> Any:
            return ((api.get(VPN, "VPNGateway", "gw1", "tenant-a") or {}).get("status") or {}).get("agent")

        def patches(pod: str) -> list[Any]:
            return api.requests(user=pod, verb="patch")

        a, b = (
            Pod(api, tmp_path, "pod-a", ManualRole("active")),
            Pod(api, tmp_path, "pod-b", ManualRole("standby")),
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.run)
                tg.start_soon(b.run)
                await a.sink.publish(status("Established", "pod-a"))
                await b.sink.publish(status("Standby", "pod-b"))
                await wait_for_async(lambda: cr() == {"daemon": "pod-a"}, 10, "pod-a's status on the CR")
                await wait_for_async(lambda: b.sink.held, 10, "pod-b holding its status")
                assert patches("pod-b") == [], "the standby wrote nothing"

                # pod-a's tunnel goes down and its write hangs at the server (a request lost in a
                # partition: it never lands); the fence comes while it is in flight.
                api.inject_fault(code=503, hang=2.0, user="pod-a", verb="patch")
                await a.sink.publish(status("Down", "pod-a"))
                await wait_for_async(lambda: a.gate.in_flight, 10, "pod-a's write in flight")
                fenced = time.time()
                a.role.set("standby")
                await wait_for_async(lambda: not a.gate.in_flight, 1, "pod-a's write cancelled at the fence")
                await a.sink.publish(status("Standby", "pod-a"))

                b.role.set("active")  # what it held is written at once, then its first status as active
                await wait_for_async(lambda: cr() == {"daemon": "pod-b"}, 10, "pod-b's held status")
                await b.sink.publish(status("Established", "pod-b"))
                await wait_for_async(
                    lambda: (
                        (api.get(VPN, "VPNGateway", "gw1", "tenant-a") or {})["status"]["tunnels"][0]["state"]
                        == "Established"
                    ),
                    10,
                    "pod-b's Established",
                )
                # The fenced pod keeps publishing (its status file and log go on): none of it is written.
                await a.sink.publish(status("Down", "pod-a"))
                # The hung request ends (503) only now: by then an ungated pod-a would have written twice.
                await wait_for_async(
                    lambda: any(r.code == 503 for r in patches("pod-a")), 10, "the hung request"
                )
                tg.cancel_scope.cancel()
        finally:
            await a.kube.aclose()
            await b.kube.aclose()
        final = api.get(VPN, "VPNGateway", "gw1", "tenant-a") or {}
        assert final["status"]["agent"] == {"daemon": "pod-b"}
        assert final["status"]["tunnels"] == [{"name": "s1", "state": "Established"}]
        late = [r for r in patches("pod-a") if r.time >= fenced]
        assert late == [], f"pod-a wrote after its fence: {late}"
        assert [r.code for r in patches("pod-a")] == [200, 503], "its first write, and the one cut off"
