"""The fault-injecting proxy in front of the REAL kube-apiserver (lab.controlplane.proxy): what passes
through is what the server said, each identity reaches the server as itself, and each fault is what a
real client (gwkit's KubeClient, kubectl) meets."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from gwkit.kube import config as kubeconfig
from gwkit.kube.client import CONFIGMAPS, KubeClient, WatchEvent
from gwkit.kube.errors import ApiError, Conflict, Gone, Unreachable
from lab.controlplane import ControlPlane
from lab.controlplane.proxy import Fault, KubeProxy, status
from lab.wait import wait_for

pytestmark = pytest.mark.lab

NS = "t-kube-proxy"
CM_LIST = rf"^/api/v1/namespaces/{NS}/configmaps$"
NOT_WATCH = r"^(?!.*watch=)"


@pytest.fixture
def proxy(controlplane: ControlPlane) -> Iterator[KubeProxy]:
    """The proxy, and namespace NS with ConfigMap ``one`` (a=1). The namespace is deleted and waited for at
    the end: the next test makes it again."""
    cp = controlplane
    cp.kubectl("create", "namespace", NS)
    try:
        cp.kubectl("create", "configmap", "one", "-n", NS, "--from-literal=a=1")
        with KubeProxy(cp) as p:
            yield p
    finally:
        cp.kubectl("delete", "namespace", NS, "--timeout=60s", check=False)


@pytest.fixture
def admin(proxy: KubeProxy, controlplane: ControlPlane, tmp_path: Path) -> Path:
    """The admin kubeconfig (client certificate) pointed at the proxy."""
    return proxy.kubeconfig(controlplane.kubeconfig, tmp_path / "admin-proxy.kubeconfig")


def kube(path: Path, timeout: float = 10.0) -> KubeClient:
    return KubeClient(kubeconfig.load(path), timeout=timeout, user_agent="proxy-test")


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


def whoami(path: Path, cp: ControlPlane) -> dict[str, Any]:
    """The server's view of ``path``'s identity (a SelfSubjectReview)."""
    server = yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"]
    with cp.client(path) as c:  # the identity in ``path``; the URL is the proxy's
        r = c.post(
            f"{server}/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    assert r.status_code == 201, r.text
    return dict(r.json()["status"]["userInfo"])


def test_get_list_and_watch_pass_through_unchanged(
    controlplane: ControlPlane, proxy: KubeProxy, admin: Path
) -> None:
    cp = controlplane

    async def through(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        async with kube(path) as k:
            one = await k.get(CONFIGMAPS, "one", NS)
            items, rv = await k.list(CONFIGMAPS, NS)
            return one, items, rv

    direct_one, direct_items, _ = run(through, cp.kubeconfig)
    via_one, via_items, rv = run(through, admin)
    assert via_one == direct_one
    assert [(i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in via_items] == [
        (i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in direct_items
    ]

    async def watch_sees_a_new_configmap() -> WatchEvent:
        async with kube(admin) as k:
            with anyio.fail_after(20):
                async for ev in k.watch(CONFIGMAPS, NS, resource_version=rv, timeout_seconds=30):
                    if ev.type == "ADDED" and ev.object["metadata"]["name"] == "two":
                        return ev
        raise AssertionError("the watch ended without the new ConfigMap")

    async def both() -> WatchEvent:
        async with anyio.create_task_group() as tg:
            result: list[WatchEvent] = []

            async def watcher() -> None:
                result.append(await watch_sees_a_new_configmap())

            tg.start_soon(watcher)
            # the watch is open once the proxy relays its headers; it starts from ``rv``, so any moment works
            await anyio.to_thread.run_sync(
                lambda: cp.kubectl("create", "configmap", "two", "-n", NS, "--from-literal=b=2")
            )
        return result[0]

    ev = run(both)
    direct = json.loads(cp.kubectl("get", "configmap", "two", "-n", NS, "-o", "json").stdout)
    assert ev.object["metadata"]["uid"] == direct["metadata"]["uid"]
    assert ev.object["data"] == {"b": "2"}
    watches = proxy.calls("GET", CM_LIST)
    assert [r.status for r in watches if "watch=1" in r.query] == [200]
    assert all(r.outcome == "passed" for r in proxy.records())


def test_each_identity_reaches_the_server_as_itself_and_no_credential_is_logged(
    controlplane: ControlPlane, proxy: KubeProxy, admin: Path, tmp_path: Path
) -> None:
    cp = controlplane
    cp.kubectl("create", "serviceaccount", "probe", "-n", NS, check=False)
    sa = proxy.kubeconfig(cp.service_account_kubeconfig(NS, "probe"), tmp_path / "sa.kubeconfig")
    node = proxy.kubeconfig(cp.node_kubeconfig("proxy-node"), tmp_path / "node.kubeconfig")

    me = whoami(admin, cp)
    assert me["username"] == "kubernetes-admin" and "system:masters" in me["groups"]
    me = whoami(node, cp)
    assert me["username"] == "system:node:proxy-node" and "system:nodes" in me["groups"]
    me = whoami(sa, cp)
    assert me["username"] == f"system:serviceaccount:{NS}:probe"
    assert "system:masters" not in me["groups"]  # the token went through, not the proxy's admin cert
    # RBAC judges the real caller: the ServiceAccount may not list Secrets, through the proxy either.
    denied = cp.kubectl("get", "secrets", "-n", NS, kubeconfig=sa, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    token = yaml.safe_load(sa.read_text())["users"][0]["user"]["token"]
    for r in proxy.records():
        assert r.header("authorization") is None
        assert all(token not in v for _, v in r.headers)


def test_injected_api_errors_reach_kube_client_as_the_server_would_send_them(
    proxy: KubeProxy, admin: Path
) -> None:
    proxy.add("PATCH", rf"^/api/v1/namespaces/{NS}/configmaps/one$", status(409), times=1)
    proxy.add("GET", CM_LIST, status(410, "continue token expired"), times=1, query=NOT_WATCH)
    proxy.add("GET", rf"^/api/v1/namespaces/{NS}/configmaps/one$", status(429), times=1)
    proxy.add("GET", rf"^/api/v1/namespaces/{NS}/configmaps/one$", status(500), times=1)

    async def scenario() -> list[ApiError]:
        got: list[ApiError] = []
        async with kube(admin) as k:
            for call in (
                lambda: k.patch(CONFIGMAPS, "one", {"data": {"a": "2"}}, NS),
                lambda: k.list(CONFIGMAPS, NS),
                lambda: k.get(CONFIGMAPS, "one", NS),
                lambda: k.get(CONFIGMAPS, "one", NS),
            ):
                try:
                    await call()
                except ApiError as exc:
                    got.append(exc)
            assert (await k.get(CONFIGMAPS, "one", NS))["data"] == {"a": "1"}  # the 409'd patch never landed
        return got

    conflict, gone, throttled, internal = run(scenario)
    assert isinstance(conflict, Conflict) and conflict.reason == "Conflict"
    assert isinstance(gone, Gone) and gone.reason == "Expired" and "continue token" in gone.message
    assert throttled.code == 429 and throttled.reason == "TooManyRequests" and throttled.retry_after == 1.0
    assert internal.code == 500 and internal.reason == "InternalError" and internal.retryable
    assert [r.outcome for r in proxy.records()][:4] == ["injected"] * 4
    assert not proxy.writes()[0].forwarded


def test_an_expired_watch_is_gone_and_a_stalled_one_says_nothing(proxy: KubeProxy, admin: Path) -> None:
    proxy.add("GET", CM_LIST, Fault.expire(), times=1, query="watch=")
    proxy.add("GET", CM_LIST, Fault.stall(30), times=1, query="watch=")

    async def expired() -> None:
        async with kube(admin) as k:
            async for _ in k.watch(CONFIGMAPS, NS, resource_version="1", timeout_seconds=30):
                pass

    with pytest.raises(Gone) as info:
        run(expired)
    assert info.value.reason == "Expired"

    # A half-open watch: the headers came (200), then silence. httpx as gwkit configures it, with a read
    # timeout of 1 s instead of BOOKMARK_SILENCE's 90 s.
    cfg = kubeconfig.load(admin)
    assert isinstance(cfg.ssl, ssl.SSLContext)
    t0 = time.monotonic()
    with (
        httpx.Client(base_url=cfg.server, verify=cfg.ssl, timeout=httpx.Timeout(5.0, read=1.0)) as c,
        c.stream("GET", f"/api/v1/namespaces/{NS}/configmaps", params={"watch": "1"}) as s,
    ):
        assert s.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            for _ in s.iter_bytes():
                pass
    assert time.monotonic() - t0 < 5
    proxy.clear()  # releases the stalled relay
    wait_for(lambda: [r.outcome for r in proxy.records()] == ["expired", "stalled"], 10, "both logged")


def test_hang_delay_and_reset_as_kube_client_meets_them(proxy: KubeProxy, admin: Path) -> None:
    path = rf"^/api/v1/namespaces/{NS}/configmaps/one$"
    proxy.add("GET", path, Fault.hang(30), times=1)
    proxy.add("GET", path, Fault.reset(), times=1)
    proxy.add("GET", path, Fault.delay(0.5), times=1)

    async def scenario() -> tuple[list[str], float]:
        out = []
        async with kube(admin, timeout=1.0) as k:
            for _ in range(2):
                try:
                    await k.get(CONFIGMAPS, "one", NS)
                except Unreachable as exc:
                    out.append(str(exc))
            t0 = time.monotonic()
            await k.get(CONFIGMAPS, "one", NS)
            return out, time.monotonic() - t0

    (hung, reset), slow = run(scenario)
    assert "timed out" in hung and "timed out" not in reset
    assert 0.5 <= slow < 5
    proxy.clear()
    wait_for(lambda: len(proxy.records()) == 3, 10, "the three logged")
    assert [r.outcome for r in proxy.records()] == ["hang", "reset", "delayed"]


def test_kubectl_through_the_proxy_errors_retries_and_an_unreachable_window(
    controlplane: ControlPlane, proxy: KubeProxy, admin: Path
) -> None:
    cp = controlplane
    got = cp.kubectl("get", "configmap", "one", "-n", NS, "-o", "json", kubeconfig=admin)
    assert json.loads(got.stdout)["data"] == {"a": "1"}

    proxy.add("GET", CM_LIST, status(500, "etcd is on fire"), times=1, query=NOT_WATCH)
    failed = cp.kubectl("get", "configmaps", "-n", NS, kubeconfig=admin, check=False)
    assert failed.returncode != 0 and "etcd is on fire" in failed.stderr, failed.stderr

    # client-go honours Retry-After on a 429: two refusals, then the answer, one kubectl run
    rule = proxy.add("GET", CM_LIST, status(429), times=2, query=NOT_WATCH)
    proxy.clear_log()
    listed = cp.kubectl("get", "configmaps", "-n", NS, "-o", "name", kubeconfig=admin)
    assert "configmap/one" in listed.stdout and rule.hits == 2
    assert [r.status for r in proxy.calls("GET", CM_LIST)] == [429, 429, 200]
    assert all(r.user_agent.startswith("kubectl") for r in proxy.records())

    proxy.unreachable(3.0)
    refused = cp.kubectl("get", "ns", NS, kubeconfig=admin, check=False, timeout=20)
    assert refused.returncode != 0 and "refused" in refused.stderr, refused.stderr
    wait_for(
        lambda: cp.kubectl("get", "ns", NS, kubeconfig=admin, check=False).returncode == 0,
        15,
        "the proxy serving again after the window",
    )

    proxy.unreachable(30.0, mode="reset")
    reset = cp.kubectl("get", "ns", NS, kubeconfig=admin, check=False, timeout=20)
    assert reset.returncode != 0 and "connection reset" in reset.stderr, reset.stderr
    proxy.reachable()
    cp.kubectl("get", "ns", NS, kubeconfig=admin)
