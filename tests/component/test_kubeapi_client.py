"""Contract tests of the Kubernetes API emulator with the official ``kubernetes`` client (37.0.2).

What the gateway pods' agents do (merge-patch of the CR's /status with a ServiceAccount token, watches of
ConfigMaps/Secrets) and what a controller relies on (201 returning the object, 409 on a stale update, watch
resumption, 410 handling), through the client's own kubeconfig loading and TLS verification.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException

from controller.api.crds import crds
from lab.kubeapi import KubeAPIThread

GROUP, VERSION, PLURAL = "vpn.bnerd.net", "v1alpha1", "vpngateways"
WG = {
    "listenPort": 51820,
    "address": "10.99.0.1/24",
    "privateKeySecretRef": {"name": "gw-wg", "key": "privateKey"},
}
# The client's models are partly typed (Optional everywhere); these tests use them as a client does.
client: Any = _client
config: Any = _config
watch: Any = _watch


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig", bookmark_interval=0.2) as a:
        yield a


@pytest.fixture
def admin(api: KubeAPIThread) -> Iterator[Any]:
    c = config.new_client_from_config(config_file=str(api.kubeconfig))
    yield c
    c.close()


def _install_crds(admin: Any) -> None:
    ext = client.ApiextensionsV1Api(admin)
    for crd in crds():
        ext.create_custom_resource_definition(crd)


def _gateway(name: str = "gw", ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VPNGateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "wireguard", "serviceCIDR": "198.18.0.0/24", "wireguard": WG},
    }


def test_typed_client_create_list_update_conflict(admin: Any) -> None:
    core = client.CoreV1Api(admin)
    cm = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="a"), data={"k": "v"})
    )
    assert cm.metadata.uid and cm.metadata.resource_version.isdigit()
    names = [c.metadata.name for c in core.list_namespaced_config_map("default").items]
    assert names == ["a"]
    cm.data = {"k": "w"}
    updated = core.replace_namespaced_config_map("a", "default", cm)
    assert updated.data == {"k": "w"}
    cm.data = {"k": "stale"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("a", "default", cm)
    assert err.value.status == 409 and "the object has been modified" in str(err.value.body)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", "default")
    assert missing.value.status == 404


def test_custom_objects_create_returns_the_object_and_status_merge_patch(admin: Any) -> None:
    _install_crds(admin)
    co = client.CustomObjectsApi(admin)
    created = co.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _gateway())
    assert created["metadata"]["generation"] == 1 and created["metadata"]["uid"]
    out = co.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "gw", {"status": {"nodeName": "n1"}}
    )
    assert out["status"] == {"nodeName": "n1"} and out["metadata"]["generation"] == 1
    listed = co.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, label_selector="", field_selector="metadata.name=gw"
    )
    assert [o["metadata"]["name"] for o in listed["items"]] == ["gw"]
    co.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "gw")
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "gw")
    assert err.value.status == 404


def test_agent_with_a_service_account_token_may_patch_only_its_status(
    api: KubeAPIThread, admin: Any, tmp_path: Path
) -> None:
    _install_crds(admin)
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="t")))
    core.create_namespaced_service_account(
        "t", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="gw"))
    )
    client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, "t", PLURAL, _gateway(ns="t")
    )
    rbac.create_cluster_role(
        {
            "metadata": {"name": "agent"},
            "rules": [{"apiGroups": [GROUP], "resources": ["vpngateways/status"], "verbs": ["patch"]}],
        }
    )
    rbac.create_namespaced_role_binding(
        "t",
        {
            "metadata": {"name": "agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "gw", "namespace": "t"}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "gw", "t", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    agent = config.new_client_from_config(
        config_file=str(api.write_kubeconfig(tmp_path / "agent", token, namespace="t"))
    )
    try:
        co = client.CustomObjectsApi(agent)
        out = co.patch_namespaced_custom_object_status(
            GROUP, VERSION, "t", PLURAL, "gw", {"status": {"agent": {"connected": True}}}
        )
        assert out["status"]["agent"] == {"connected": True}
        with pytest.raises(ApiException) as err:
            co.patch_namespaced_custom_object(
                GROUP, VERSION, "t", PLURAL, "gw", {"spec": {"type": "wireguard"}}
            )
        assert err.value.status == 403
        assert (
            'cannot patch resource \\"vpngateways\\" in API group \\"vpn.bnerd.net\\" in the '
            'namespace \\"t\\"' in str(err.value.body)
        )
    finally:
        agent.close()
    patches = api.requests(verb="patch", subresource="status", user="system:serviceaccount:t:gw")
    assert [r.code for r in patches] == [200]


def test_watch_resumes_from_a_resource_version_and_raises_410_once_compacted(
    api: KubeAPIThread, admin: Any
) -> None:
    core = client.CoreV1Api(admin)
    first = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="w"))
    )
    rv = first.metadata.resource_version
    core.patch_namespaced_config_map("w", "default", {"data": {"a": "1"}})
    core.create_namespaced_secret(
        "default", client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "v"})
    )
    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=2):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"].data))
        if len(seen) == 1:
            w.stop()
    assert seen == [("MODIFIED", "w", {"a": "1"})]
    secrets = [
        ev["object"].data
        for ev in watch.Watch().stream(core.list_namespaced_secret, "default", timeout_seconds=1)
    ]
    assert secrets == [{"k": "dg=="}]
    api.compact()
    with pytest.raises(ApiException) as err:
        for _ in watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=2
        ):
            pass
    assert err.value.status == 410 and "too old resource version" in str(err.value.reason)


def test_watch_events_arrive_while_streaming(api: KubeAPIThread, admin: Any) -> None:
    core = client.CoreV1Api(admin)
    got: list[str] = []
    ready = threading.Event()

    def run() -> None:
        w = watch.Watch()
        ready.set()
        for ev in w.stream(
            core.list_namespaced_config_map, "default", timeout_seconds=5, allow_watch_bookmarks=True
        ):
            if ev["type"] == "ADDED":
                got.append(ev["object"].metadata.name)
            if len(got) == 2:
                w.stop()

    t = threading.Thread(target=run)
    t.start()
    ready.wait()
    for n in ("x", "y"):
        core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=n)))
    t.join(timeout=10)
    assert got == ["x", "y"]


def test_lease_update_needs_the_current_resource_version(admin: Any) -> None:
    coord = client.CoordinationV1Api(admin)
    lease = coord.create_namespaced_lease(
        "kube-system",
        {
            "metadata": {"name": "vpngw-controller"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
    )
    lease.spec.holder_identity = "b"
    coord.replace_namespaced_lease("vpngw-controller", "kube-system", lease)
    lease.spec.holder_identity = "c"  # the same, now stale, resourceVersion: another candidate won
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("vpngw-controller", "kube-system", lease)
    assert err.value.status == 409
    assert coord.read_namespaced_lease("vpngw-controller", "kube-system").spec.holder_identity == "b"


def test_faults_reach_the_client(api: KubeAPIThread, admin: Any) -> None:
    core = client.CoreV1Api(admin)
    api.inject_fault(500, verb="list", resource="configmaps")
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default")
    assert err.value.status == 500 and "Internal error occurred" in str(err.value.body)
    since = api.reset_requests()
    api.inject_fault(503, verb="list", resource="configmaps", retry_after=1)
    assert core.list_namespaced_config_map("default").items == []  # urllib3 honours Retry-After on a 503
    assert [r.code for r in api.requests(verb="list", since=since)] == [503, 200]
