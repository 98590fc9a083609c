"""The controller's /metrics: the work queue's depth, delayed keys, wait, retries and longest-running
reconcile; API requests by verb/resource/code; OpenStack calls; informer relists; build info. Values are
read back from the registry after driving the real queue, client hooks and worker."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import generate_latest

from controller.cloud import StaticCloud
from controller.informer import Informer
from controller.leader import AlwaysLeader
from controller.names import GatewayKey
from controller.openstack import OpenStackCloud, OpenStackSettings
from controller.run import Metrics, Operator
from controller.settings import Settings
from controller.workqueue import WorkQueue
from gwkit.kube import ClusterConfig, KubeClient, NotFound
from gwkit.kube.client import VPNGATEWAYS, resource_of_path, verb_of
from gwkit.version import UNKNOWN, version

A, B, C = (GatewayKey("VPNGateway", "t", n) for n in "abc")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


@pytest.mark.anyio
async def test_queue_depth_delayed_wait_retries_and_longest_running() -> None:
    m, clock = Metrics(process=False), Clock()
    q: WorkQueue[GatewayKey] = WorkQueue(clock=clock, on_wait=m.queue_wait.observe)
    m.watch_queue(q)
    q.add(A)
    q.add(B)
    q.add(A)  # once in the queue however often added
    assert value(m, "vpngw_controller_queue_depth") == 2
    clock.now += 3.0
    assert await q.get() == A
    assert value(m, "vpngw_controller_queue_wait_seconds_count") == 1
    assert value(m, "vpngw_controller_queue_wait_seconds_sum") == 3.0
    assert value(m, "vpngw_controller_queue_wait_seconds_bucket", le="2.5") == 0
    assert value(m, "vpngw_controller_queue_wait_seconds_bucket", le="5.0") == 1
    clock.now += 7.0
    assert value(m, "vpngw_controller_longest_running_reconcile_seconds") == 7.0
    q.retry(A)  # A fails: held back by its backoff, not queued
    q.done(A)
    assert value(m, "vpngw_controller_retries_total") == 1
    assert value(m, "vpngw_controller_queue_depth") == 1  # B
    assert value(m, "vpngw_controller_queue_delayed") == 1  # A
    assert value(m, "vpngw_controller_longest_running_reconcile_seconds") == 0
    clock.now += 1.0  # A's backoff (0.2 s) is over: queued again, its wait counted from now
    assert await q.get() == B
    assert value(m, "vpngw_controller_queue_delayed") == 0
    assert value(m, "vpngw_controller_queue_depth") == 1
    assert await q.get() == A
    assert value(m, "vpngw_controller_queue_wait_seconds_count") == 3
    assert value(m, "vpngw_controller_queue_wait_seconds_sum") == 3.0 + 11.0 + 0.0


@pytest.mark.anyio
async def test_a_reconcile_that_raises_bumps_retries_and_the_error_result() -> None:
    kube = KubeClient(ClusterConfig("https://127.0.0.1:9", False))
    op = Operator(kube, Settings(), StaticCloud({}), AlwaysLeader())
    calls: list[GatewayKey] = []
    again = anyio.Event()

    async def reconcile(key: GatewayKey) -> str:
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        again.set()
        return "ok"

    op.reconcile = reconcile  # type: ignore[method-assign]
    op.queue.base = 0.01
    op.queue.add(A)
    async with anyio.create_task_group() as tg:
        tg.start_soon(op.worker)
        with anyio.fail_after(5):
            await again.wait()
        await anyio.wait_all_tasks_blocked()  # the worker has counted the second reconcile
        tg.cancel_scope.cancel()
    await kube.aclose()
    m = op.metrics
    assert value(m, "vpngw_controller_retries_total") == 1
    assert value(m, "vpngw_controller_reconcile_total", result="error") == 1
    assert value(m, "vpngw_controller_reconcile_total", result="ok") == 1
    assert value(m, "vpngw_controller_queue_wait_seconds_count") == 2


@pytest.mark.parametrize(
    "method, path, verb, resource",
    [
        pytest.param("GET", "/api/v1/namespaces/ns/pods", "list", "pods", id="list-namespaced"),
        pytest.param("GET", "/api/v1/nodes/n1", "get", "nodes", id="get-cluster-scoped"),
        pytest.param("GET", "/api/v1/namespaces", "list", "namespaces", id="list-namespaces"),
        pytest.param("GET", "/api/v1/namespaces/kube-system", "get", "namespaces", id="get-namespace"),
        pytest.param(
            "PATCH",
            "/apis/vpn.bnerd.net/v1alpha1/namespaces/t/vpngateways/gw/status",
            "patch",
            "vpngateways.vpn.bnerd.net/status",
            id="status-subresource",
        ),
        pytest.param(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/l",
            "update",
            "leases.coordination.k8s.io",
            id="update",
        ),
        pytest.param(
            "POST", "/apis/apps/v1/namespaces/x/deployments", "create", "deployments.apps", id="create"
        ),
        pytest.param("GET", "/version", "list", "other", id="not-a-resource"),
    ],
)
def test_verb_and_resource_of_a_request(method: str, path: str, verb: str, resource: str) -> None:
    assert (verb_of(method, path), resource_of_path(path)) == (verb, resource)


@pytest.mark.anyio
async def test_the_kube_client_reports_every_request_with_its_code() -> None:
    m = Metrics(process=False)

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/missing"):
            return httpx.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})
        return httpx.Response(200, json={"items": [], "metadata": {"resourceVersion": "1"}})

    kube = KubeClient(ClusterConfig("https://api.test", False), observe=m.api_request)
    kube._http = httpx.AsyncClient(base_url="https://api.test", transport=httpx.MockTransport(api))
    await kube.list(VPNGATEWAYS, "t")
    with pytest.raises(NotFound):
        await kube.get(VPNGATEWAYS, "missing", "t")
    await kube.aclose()
    res = "vpngateways.vpn.bnerd.net"
    assert value(m, "vpngw_controller_api_requests_total", verb="list", resource=res, code="200") == 1
    assert value(m, "vpngw_controller_api_requests_total", verb="get", resource=res, code="404") == 1
    assert value(m, "vpngw_controller_api_request_duration_seconds_count", verb="get", resource=res) == 1


class HttpError(Exception):
    status_code = 409


class Network:
    def create_port(self, **kw: Any) -> str:
        return "port"

    def delete_port(self, port: str, **kw: Any) -> None:
        raise HttpError("conflict")

    def ports(self, **kw: Any) -> Any:
        yield from ("p1", "p2")


class Conn:
    network = Network()
    compute = None


def test_every_openstack_call_is_counted_timed_and_its_errors_by_code() -> None:
    m = Metrics(process=False)
    cloud = OpenStackCloud(Conn(), OpenStackSettings("net", "ext"), observe=m.cloud_call)
    assert cloud.conn.network.create_port(name="x") == "port"
    with pytest.raises(HttpError):
        cloud.conn.network.delete_port("p")
    listing = cloud.conn.network.ports()
    assert value(m, "vpngw_controller_openstack_requests_total", operation="network.ports") is None
    assert list(listing) == ["p1", "p2"]  # a listing counts once it has been read
    assert value(m, "vpngw_controller_openstack_requests_total", operation="network.ports") == 1
    assert value(m, "vpngw_controller_openstack_requests_total", operation="network.create_port") == 1
    assert (
        value(m, "vpngw_controller_openstack_errors_total", operation="network.delete_port", code="409") == 1
    )
    assert (
        value(m, "vpngw_controller_openstack_errors_total", operation="network.create_port", code="409")
        is None
    )
    count = "vpngw_controller_openstack_request_duration_seconds_count"
    assert value(m, count, operation="network.delete_port") == 1


class Lister:
    async def list(self, res: Any, namespace: Any, **kw: Any) -> tuple[list[Any], str]:
        return [], "7"


@pytest.mark.anyio
async def test_an_informer_counts_its_lists_after_the_first_as_relists() -> None:
    m = Metrics(process=False)
    informer = Informer(Lister(), VPNGATEWAYS, on_relist=m.relisted)  # type: ignore[arg-type]
    await informer._list()  # the first list: a sync, not a relist
    assert value(m, "vpngw_controller_informer_relists_total", resource="vpngateways.vpn.bnerd.net") is None
    await informer._list()  # after a 410 Gone
    await informer._list()
    assert value(m, "vpngw_controller_informer_relists_total", resource="vpngateways.vpn.bnerd.net") == 2


def test_build_info() -> None:
    m = Metrics(process=False)
    assert version() != UNKNOWN  # the checkout is installed (editable): its metadata has the version
    assert value(m, "vpngw_build_info", version=version(), program="controller") == 1


def test_the_process_collectors_are_on_the_registry() -> None:
    text = generate_latest(Metrics().registry).decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"\n{name}" in text or text.startswith(name)
