"""``python -m controller diagnose`` reads the status-agent's ``/readyz`` on the pod's IP, and where that is
unreachable (outside the cluster; the gateway's NetworkPolicy) through the API server's pod proxy, and
says which answered; with neither, a note (not a problem) names both failures and the right the proxy
needs (``get pods/proxy``).

The pod's IP lives in a network namespace of its own (a stand-in for the cluster's pod network: the
diagnose process has no route into it) and the API emulator's pods/proxy dials pod IPs there
(``KubeAPI.set_pod_network``), as a real API server reaches the pod network."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.cluster import GATEWAY_NAMESPACE, Cluster
from lab.kubelet.nsnet import in_netns
from tests.component.test_controller_diagnose import KEY, NS, diagnose, healthy_world

POD_IP = "10.250.77.5"
"""On the pod network's ``lo``; the host has no route to it (its default route, if any, leads nowhere
that answers within the 1 s --readyz-timeout)."""
NOT_READY = "not ready: charon unreachable: [Errno 2] No such file or directory\n"
READ_RULES = [
    {
        "apiGroups": ["*"],
        "resources": [
            "vpngateways", "ipsecgateways", "vpnpeers", "secrets", "namespaces", "nodes", "configmaps",
            "deployments", "serviceaccounts", "roles", "rolebindings", "networkpolicies",
            "network-attachment-definitions", "pods", "events",
        ],
        "verbs": ["get", "list"],
    }
]  # fmt: skip
"""What diagnose reads, without ``pods/proxy``."""


class _Agent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name for it
        body = NOT_READY.encode() if self.path == "/readyz" else b"404 page not found\n"
        self.send_response(503 if self.path == "/readyz" else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def pod_network() -> Iterator[tuple[str, int]]:
    """(netns, port) of an HTTP server on POD_IP answering /readyz as a not-ready status-agent."""
    name = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}-podnet"
    netns.add_ns(name)
    server: HTTPServer | None = None
    try:
        netns.addr(name, "lo", f"{POD_IP}/32")

        def listen() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((POD_IP, 0))
            s.listen(16)
            return s

        sock = in_netns(name, listen)
        server = HTTPServer((POD_IP, 0), _Agent, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.server_address = sock.getsockname()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield name, int(sock.getsockname()[1])
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        netns.destroy_ns(name)


def world(cluster: Cluster, port: int) -> None:
    """The healthy-looking gateway of test_controller_diagnose, its pod on POD_IP with the agent's port."""
    healthy_world(cluster)
    pod_name = f"{KEY.home_name}-7d9f-abcde"
    pod = cluster.get("v1", "Pod", pod_name, GATEWAY_NAMESPACE)
    assert pod is not None
    cluster.kube.delete("v1", "Pod", pod_name, GATEWAY_NAMESPACE)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**pod["metadata"]}, "spec": pod["spec"]}
    for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
        pod["metadata"].pop(k, None)
    pod["metadata"]["name"] = f"{KEY.home_name}-7d9f-fghij"
    pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = port
    cluster.kube.create(pod)
    status = {"phase": "Running", "podIP": POD_IP, "conditions": [{"type": "Ready", "status": "True"}]}
    cluster.kube.patch(
        "v1", "Pod", pod["metadata"]["name"], {"status": status}, GATEWAY_NAMESPACE, subresource="status"
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.add_node("node-a")
        yield c


def test_readyz_unreachable_on_the_pod_ip_is_read_through_the_pod_proxy(
    cluster: Cluster, pod_network: tuple[str, int]
) -> None:
    ns, port = pod_network
    cluster.kube.set_pod_network(ns)
    world(cluster, port)
    res = diagnose(cluster, f"VPNGateway/{NS}/acme", "--readyz-timeout", "1")
    assert res.returncode == 1, res.stdout + res.stderr  # the agent's 503 is a problem
    assert "status-agent /readyz: HTTP 503, read through the API server's pod proxy" in res.stdout, res.stdout
    assert "charon unreachable: [Errno 2]" in res.stdout, "the agent's own words, relayed"
    proxied = cluster.kube.requests(subresource="proxy", resource="pods")
    assert [(r.verb, r.code, r.name) for r in proxied] == [("get", 503, f"{KEY.home_name}-7d9f-fghij:{port}")]
    assert proxied[0].path.endswith("/proxy/readyz")
    doc = json.loads(diagnose(cluster, f"VPNGateway/{NS}/acme", "--readyz-timeout", "1", "-o", "json").stdout)
    assert doc["readyz"] == {"code": 503, "via": "the API server's pod proxy"}


def test_without_pods_proxy_neither_answers_and_a_note_says_why(
    cluster: Cluster, pod_network: tuple[str, int], tmp_path: Path
) -> None:
    ns, port = pod_network
    cluster.kube.set_pod_network(ns)
    world(cluster, port)
    rbac = "rbac.authorization.k8s.io/v1"
    cluster.kube.create(
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "reader"}, "rules": READ_RULES}
    )
    cluster.kube.create(
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
        }
    )
    kubeconfig = cluster.kube.write_kubeconfig(
        tmp_path / "alice.kubeconfig", cluster.kube.user_token("alice")
    )
    res = diagnose(cluster, f"VPNGateway/{NS}/acme", "--readyz-timeout", "1", "--kubeconfig", str(kubeconfig))
    assert res.returncode == 0, res.stdout + res.stderr  # a note is not a problem
    doc = json.loads(
        diagnose(
            cluster,
            f"VPNGateway/{NS}/acme",
            "--readyz-timeout",
            "1",
            "--kubeconfig",
            str(kubeconfig),
            "-o",
            "json",
        ).stdout
    )
    (note,) = doc["findings"]
    assert (note["severity"], note["code"]) == ("info", "ReadyzUnreachable"), note
    assert f"http://{POD_IP}:{port}/readyz: not reachable from here" in note["cause"], note
    assert "HTTP 403 Forbidden" in note["cause"] and "get pods/proxy" in note["cause"], note
    assert f"get pods/proxy -n {GATEWAY_NAMESPACE}" in note["fix"], note
    assert doc["readyz"] == {"code": None, "via": None}
    refused = cluster.kube.requests(user="alice", subresource="proxy")
    assert refused and {r.code for r in refused} == {403}


def test_the_emulators_pod_proxy_refuses_as_kube_apiserver_does(
    cluster: Cluster, pod_network: tuple[str, int]
) -> None:
    """What diagnose tells apart from the agent's answer: the API server's own Status (NotFound, the
    loopback or missing pod IP "address not allowed", a pod port nothing listens on "error trying to reach
    service"), against the agent's own text answer relayed with its code."""
    import anyio

    from controller.diagnosecli import _through_proxy
    from gwkit.kube import KubeClient, load

    ns, port = pod_network
    cluster.kube.set_pod_network(ns)
    world(cluster, port)
    pod = f"{KEY.home_name}-7d9f-fghij"
    base = f"/api/v1/namespaces/{GATEWAY_NAMESPACE}/pods"

    async def ask(path: str) -> Any:
        async with KubeClient(load(cluster.kubeconfig)) as kube:
            return await _through_proxy(kube, path, 5.0)

    def got(path: str) -> Any:
        return anyio.run(ask, path)

    agent = got(f"{base}/{pod}:{port}/proxy/readyz")
    assert (agent.code, agent.body) == (503, NOT_READY)
    assert 'HTTP 404 NotFound: pods "nope" not found' in got(f"{base}/nope:{port}/proxy/readyz")
    closed = got(f"{base}/{pod}:1/proxy/readyz")
    assert (
        f"HTTP 503 ServiceUnavailable: error trying to reach service: dial tcp {POD_IP}:1: connect: "
        in closed
    )
    assert "connection refused" in closed
    cluster.kube.patch(
        "v1", "Pod", pod, {"status": {"podIP": "127.0.0.1"}}, GATEWAY_NAMESPACE, subresource="status"
    )
    assert "HTTP 400 BadRequest: address not allowed" in got(f"{base}/{pod}:{port}/proxy/readyz")
