"""The agent's HA elector against the REAL kube-apiserver (lab.controlplane): the takeover after a kill and
the partition order of tests/component/test_agent_ha.py, with a ``world`` on the real server. What the real
server judges that the emulator might not: the Lease's validation (MicroTime fields with exactly six
fraction digits, ``leaseDurationSeconds`` > 0, an empty holder on release), its resourceVersion
preconditions, and RBAC by resourceName for ``get`` and ``update`` (each pod is a ServiceAccount bound to a
Role with ``POD_RULES`` only).

Each pod reaches the API through its own fault proxy (``lab.controlplane.proxy.KubeProxy``): the
partition is a rule that holds every Lease request of that pod without an answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.controlplane import ControlPlane
from lab.controlplane.proxy import KubeProxy
from lab.openstack.proxy import Fault
from tests.component.test_agent_ha import (
    LEASE,
    World,
    lease_doc,
    role_binding,
    test_a_deleted_lease_keeps_its_holder_until_its_deadline_and_a_recreated_one_is_no_release,
    test_a_graceful_stop_releases_and_the_standby_takes_over_without_waiting,
    test_a_killed_holder_is_taken_over_only_after_its_duration,
    test_a_partitioned_holder_turns_standby_before_the_other_turns_active,
    test_the_lease_fields_are_judged_as_kube_apiserver_judges_them,
)

__all__ = [  # the emulator's tests, collected here again with this module's ``world``
    "test_a_deleted_lease_keeps_its_holder_until_its_deadline_and_a_recreated_one_is_no_release",
    "test_a_graceful_stop_releases_and_the_standby_takes_over_without_waiting",
    "test_a_killed_holder_is_taken_over_only_after_its_duration",
    "test_a_partitioned_holder_turns_standby_before_the_other_turns_active",
    "test_the_lease_fields_are_judged_as_kube_apiserver_judges_them",
]

pytestmark = pytest.mark.lab

_TAGS = itertools.count(1)
PODS = ("pod-a", "pod-b")


class RealWorld:
    def __init__(self, cp: ControlPlane, tmp: Path, tag: str) -> None:
        self.cp = cp
        self.tmp = tmp
        self.namespace = f"ha-elector-{tag}"
        self.proxies: dict[str, KubeProxy] = {}
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": p, "namespace": self.namespace},
            }
            for p in PODS
        ]
        subjects = [{"kind": "ServiceAccount", "name": p, "namespace": self.namespace} for p in PODS]
        docs += role_binding(self.namespace, subjects)
        with cp.client() as c:
            self._ok(c.post("/api/v1/namespaces", json={"metadata": {"name": self.namespace}}))
            for d in docs:
                kind = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}
                prefix = "/api/v1" if d["kind"] == "ServiceAccount" else "/apis/rbac.authorization.k8s.io/v1"
                self._ok(c.post(f"{prefix}/namespaces/{self.namespace}/{kind[d['kind']]}", json=d))

    @staticmethod
    def _ok(r: Any) -> Any:
        assert r.status_code < 300, f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:500]}"
        return r.json()

    def pod_kubeconfig(self, pod: str) -> Path:
        proxy = self.proxies.get(pod)
        if proxy is None:
            proxy = self.proxies[pod] = KubeProxy(self.cp, name=f"ha-{pod}").start()
        source = self.cp.service_account_kubeconfig(self.namespace, pod)
        return proxy.kubeconfig(source, self.tmp / f"{pod}.kubeconfig")

    def create_lease(self, spec: dict[str, Any]) -> None:
        with self.cp.client() as c:
            self._ok(
                c.post(
                    f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                    json=lease_doc(self.namespace, spec),
                )
            )

    def post_lease(self, name: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        doc = {**lease_doc(self.namespace, spec), "metadata": {"name": name, "namespace": self.namespace}}
        with self.cp.client() as c:
            r = c.post(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", json=doc)
        return r.status_code, r.json()

    def lease(self) -> dict[str, Any] | None:
        with self.cp.client() as c:
            r = c.get(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}")
        if r.status_code == 404:
            return None
        got: dict[str, Any] = self._ok(r)
        return got

    def delete_lease(self) -> None:
        with self.cp.client() as c:
            self._ok(c.delete(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}"))

    def partition(self, pod: str) -> None:
        self.proxies[pod].add(None, r"/leases", Fault.hang(60.0))

    def heal(self, pod: str) -> None:
        self.proxies[pod].clear()

    def close(self) -> None:
        for p in self.proxies.values():
            p.close()
        with self.cp.client() as c:
            c.delete(f"/api/v1/namespaces/{self.namespace}")


@pytest.fixture
def world(controlplane: ControlPlane, tmp_path: Path) -> Iterator[World]:
    w = RealWorld(controlplane, tmp_path, f"{next(_TAGS)}")
    try:
        yield w
    finally:
        w.close()
