"""The controller as a process (``python -m controller run``) against the Kubernetes API emulator
(``lab.kubeapi``, a real HTTPS server; ``lab.cluster`` installs the CRDs and plays the nodes' kubelets).

Create, update and delete gateways; owned objects deleted or edited are restored; a node that goes
NotReady re-pins its gateway; an invalid CR keeps the deployed plan; injected 409s, a 410 and an API
server that is away for 30 s are survived without a lost change; a no-op resync writes nothing (counted
in the emulator's request log); the controller's and the agent's status writes do not clobber each other;
two replicas elect one leader.

The tests that exercise the API server's semantics run again, these bodies, against the REAL control plane
(tests/integration/test_controller_operator_real.py, ``cluster`` a ``lab.controlplane.operated.RealCluster``):
a body spells namespaces and nodes with ``spelled()`` and finds the gateway namespace with ``home()``.
What runs against what: docs/kubeapi.md.
"""

from __future__ import annotations

import copy
import functools
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controller.desired import plan_of
from controller.names import LABEL_TENANT, TENANT_ENABLED, GatewayKey
from lab.cluster import Cluster, Controller, home_of, secrets_for
from lab.controlplane.operated import RealCluster
from lab.kubeapi.errors import ApiError
from lab.wait import wait_for
from tests.examples import example_docs
from tests.helpers import condition

VPN = "vpn.bnerd.net/v1alpha1"
NS = "tenant-acme"
NIC = {
    "mac": "fa:16:3e:00:00:01",
    "address": "192.0.2.2/26",
    "gateway": "192.0.2.1",
    "publicIP": "203.0.113.10",
}
CONFIG = {
    "internalSourceCIDRs": ["192.0.2.64/26"],
    "allowances": {"default": {"exposureTargets": ["192.0.2.64/26"]}},
    "staticNICs": {
        "tenant-acme/acme": NIC,
        "tenant-wg/acme-wg": {**NIC, "mac": "fa:16:3e:00:00:02"},
        "tenant-old/legacy": {**NIC, "mac": "fa:16:3e:00:00:03"},
    },
}
RBAC = "rbac.authorization.k8s.io/v1"
OWNED = [
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition"),
    ("apps/v1", "Deployment"),
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.add_node("node-a", provider_id="openstack:///11111111-1111-4111-8111-111111111111")
        c.add_node("node-b", provider_id="openstack:///22222222-2222-4222-8222-222222222222")
        yield c


def spelled(cluster: Cluster, name: str) -> str:
    """``name`` (a namespace or a node) as ``cluster`` spells it: the real control plane is shared by a
    session's tests, and each test has names of its own there (tests/integration/
    test_controller_operator_real.py runs the portable tests here against it)."""
    return cluster.unique(name) if isinstance(cluster, RealCluster) else name


def home(cluster: Cluster, gateway: str, ns: str, kind: str = "VPNGateway") -> tuple[str, str]:
    """(name, namespace) of the gateway's objects in ``cluster``'s gateway namespace."""
    return (
        cluster.home_of(gateway, ns, kind) if isinstance(cluster, RealCluster) else home_of(gateway, ns, kind)
    )


def nodes(cluster: Cluster) -> tuple[str, str]:
    """The fixture's two nodes, as ``cluster`` spells them."""
    return spelled(cluster, "node-a"), spelled(cluster, "node-b")


def config_for(cluster: Cluster) -> dict[str, Any]:
    """CONFIG with its static NICs keyed by ``cluster``'s spelling of the tenant namespaces."""
    nics = {}
    static: dict[str, Any] = CONFIG["staticNICs"]  # type: ignore[assignment]
    for key, nic in static.items():
        ns, name = key.split("/")
        nics[f"{spelled(cluster, ns)}/{name}"] = nic
    return {**CONFIG, "staticNICs": nics}


def start(
    cluster: Cluster, *args: str, name: str = "controller", config: dict[str, Any] | None = None
) -> Controller:
    ctl = cluster.start_controller(config or config_for(cluster), "--resync-seconds", "600", *args, name=name)
    wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 30, "the controller to be ready")
    assert ctl.proc.poll() is None, ctl.log()
    return ctl


def gateway(
    cluster: Cluster, name: str = "acme", ns: str | None = None, kind: str = "VPNGateway"
) -> dict[str, Any]:
    api = VPN if kind == "VPNGateway" else "ipsec.bnerd.net/v1alpha1"
    gw = cluster.get(api, kind, name, ns or spelled(cluster, NS))
    assert gw is not None
    return gw


def converged(cluster: Cluster, name: str = "acme", ns: str | None = None, kind: str = "VPNGateway") -> bool:
    """Every owned object exists, and the plan has every VPNPeer naming the gateway: the first plan can
    predate peers applied with the gateway (they reach the controller's caches a moment later)."""
    ns = ns or spelled(cluster, NS)
    if not all(cluster.owned(a, k, name, ns, kind) is not None for a, k in OWNED):
        return False
    tenant = GatewayKey(kind, ns, name).object_name  # type: ignore[arg-type]
    if not all(cluster.get(RBAC, k, tenant, ns) is not None for k in ("Role", "RoleBinding")):
        return False
    cm = cluster.owned("v1", "ConfigMap", name, ns, kind)
    peers = {
        p["metadata"]["name"]
        for p in cluster.kube.list(VPN, "VPNPeer", ns)
        if (p.get("spec") or {}).get("gatewayRef", {}).get("name") == name
    }
    if cm is None or not peers:
        return cm is not None
    plan = plan_of(cm)
    names = {t.name for t in plan.ipsec.tunnels} if plan.ipsec else {p.name for p in plan.wireguard.peers}  # type: ignore[union-attr]
    return names == peers


def apply_with_secrets(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    """``docs`` and, first, the opted-in Secrets they reference (as a tenant sets up a gateway)."""
    cluster.apply(secrets_for(docs))
    cluster.apply(docs)


def in_namespace(docs: list[dict[str, Any]], ns: str) -> list[dict[str, Any]]:
    for d in docs:
        d["metadata"]["namespace"] = ns
    return docs


def apply_ipsec(cluster: Cluster) -> None:
    apply_with_secrets(cluster, in_namespace(example_docs("ipsec.yaml"), spelled(cluster, NS)))


def wireguard_docs(cluster: Cluster) -> list[dict[str, Any]]:
    """The WireGuard example in a namespace of its own (its peer s1 would collide with the IPsec one's),
    with a serviceCIDR of its own (gateways on one transit network need disjoint ones)."""
    docs = in_namespace(example_docs("wireguard.yaml"), spelled(cluster, "tenant-wg"))
    docs[0]["spec"]["serviceCIDR"] = "198.18.1.0/24"
    return docs


def legacy_docs(cluster: Cluster) -> list[dict[str, Any]]:
    """The legacy example with a serviceCIDR of its own."""
    docs = in_namespace(example_docs("legacy-ipsecgateway.yaml"), spelled(cluster, "tenant-old"))
    docs[0]["spec"]["serviceCIDR"] = "198.18.2.0/24"
    return docs


def writes(cluster: Cluster, since: int) -> list[Any]:
    return [r for r in cluster.kube.requests(writes_only=True, since=since) if r.resource != "leases"]


def seq(cluster: Cluster) -> int:
    recs = cluster.kube.requests()
    return recs[-1].seq if recs else 0


def test_a_gateway_is_reconciled_into_its_objects_status_and_finalizer(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    ctl = start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    gw = wait_for(lambda: (g := gateway(cluster)).get("status", {}).get("publicIP") and g, 10, "the status")
    assert gw["metadata"]["finalizers"] == ["vpn.bnerd.net/cleanup"]
    assert gw["status"]["nodeName"] in nodes(cluster) and gw["status"]["publicIP"] == "203.0.113.10"
    assert condition(gw, "ConfigRendered")["status"] == "True"
    # No kubelet runs the gateway pod: the emulator has no ReplicaSet controller either (no pod at all);
    # the real one makes the pod a moment later, and it stays Pending.
    no_pod = "PodNotReady" if isinstance(cluster, RealCluster) else "NoPod"
    wait_for(
        lambda: condition(gateway(cluster), "PodReady").get("reason") == no_pod, 20, f"PodReady {no_pod}"
    )
    dep = cluster.owned("apps/v1", "Deployment", "acme", ns)
    assert dep is not None and dep["spec"]["template"]["spec"]["nodeName"] == gw["status"]["nodeName"]
    plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", ns))  # type: ignore[arg-type]
    assert plan.nic.mac == NIC["mac"] and [t.name for t in plan.ipsec.tunnels] == ["s1", "s2"]  # type: ignore[union-attr]
    _, metrics = ctl.get("/metrics")
    assert 'vpngw_controller_reconcile_total{result="ok"}' in metrics
    assert "vpngw_controller_leader 1.0" in metrics and "vpngw_controller_queue_depth" in metrics


def test_a_grant_revoked_rewrites_the_plan_and_leaves_the_deployment_alone(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    # Its generation, not its resourceVersion: the real Deployment controller writes its status (a new
    # resourceVersion) at any time; a spec write moves the generation.
    dep = cluster.owned("apps/v1", "Deployment", "acme", ns)
    assert dep is not None
    generation, template = dep["metadata"]["generation"], dep["spec"]["template"]
    cluster.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, ns)

    def revoked() -> bool:
        plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", ns))  # type: ignore[arg-type]
        return not any(g.peer == "s2" for g in plan.nat.grants)

    wait_for(revoked, 10, "the plan without s2's grant")
    dep = cluster.owned("apps/v1", "Deployment", "acme", ns)
    assert dep is not None and dep["spec"]["template"] == template, "the pod template was not touched"
    assert dep["metadata"]["generation"] == generation, "nor anything else of the Deployment's spec"


@pytest.mark.parametrize("api_version, kind", OWNED)
def test_an_owned_object_deleted_or_edited_is_restored(cluster: Cluster, api_version: str, kind: str) -> None:
    ns = spelled(cluster, NS)
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    before = cluster.owned(api_version, kind, "acme", ns)
    assert before is not None
    cluster.kube.delete(api_version, kind, *home(cluster, "acme", ns))
    wait_for(
        lambda: (
            (o := cluster.owned(api_version, kind, "acme", ns)) is not None
            and o["metadata"]["uid"] != before["metadata"]["uid"]
        ),
        10,
        f"{kind} re-created",
    )
    edits: dict[str, Any] = {
        "ConfigMap": {"data": {"plan.json": "{}"}},
        "ServiceAccount": {"automountServiceAccountToken": False},
        "Role": {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]},
        "RoleBinding": {"subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]},
        "NetworkPolicy": {"spec": {"egress": [{}]}},
        "NetworkAttachmentDefinition": {"spec": {"config": "{}"}},
        "Deployment": {"spec": {"template": {"spec": {"hostPID": True, "nodeName": "elsewhere"}}}},
    }
    good = cluster.owned(api_version, kind, "acme", ns)
    assert good is not None
    name, where = home(cluster, "acme", ns)
    if kind == "Deployment":
        # An edit neither server takes: the host's network namespace for a pod that sets its own net
        # sysctls (validation.go ValidateHostSysctl; the emulator took it until the real server refused it).
        refused = {"spec": {"template": {"spec": {"hostNetwork": True}}}}
        with pytest.raises(ApiError) as exc:
            cluster.kube.patch(api_version, kind, name, refused, where)
        assert exc.value.code == 422, exc.value
        field = "spec.template.spec.securityContext.sysctls[0].name"
        words = "may not be specified when 'hostNetwork' is true"
        assert f'{field}: Invalid value: "net.ipv4.ip_forward": {words}' in exc.value.message, exc.value
    cluster.kube.patch(api_version, kind, name, edits[kind], where)

    def restored() -> bool:
        o = cluster.owned(api_version, kind, "acme", ns)
        assert o is not None
        skip = ("metadata", "status")
        return all(o.get(k) == v for k, v in good.items() if k not in skip)

    wait_for(restored, 10, f"{kind} restored")


def test_a_node_that_goes_not_ready_repins_its_gateway_promptly(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    start(cluster)
    apply_ipsec(cluster)
    gw = wait_for(
        lambda: (g := gateway(cluster)).get("status", {}).get("nodeName") and g, 20, "a pinned gateway"
    )
    first = gw["status"]["nodeName"]
    node_a, node_b = nodes(cluster)
    other = node_b if first == node_a else node_a
    cluster.set_node_ready(first, False)
    wait_for(
        lambda: gateway(cluster)["status"].get("nodeName") == other, 10, f"the gateway re-pinned to {other}"
    )
    dep = cluster.owned("apps/v1", "Deployment", "acme", ns)
    assert dep["spec"]["template"]["spec"]["nodeName"] == other  # type: ignore[index]
    events = wait_for(
        lambda: [e for e in cluster.kube.list("v1", "Event", ns) if e["reason"] == "Repinned"],
        5,
        "the Event (written after the status)",
    )
    assert f"node {first} is not Ready" in events[0]["message"]


def test_an_invalid_grant_is_left_out_and_a_revocation_in_the_same_edit_applied(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    # s1 loses db and asks for an exposure that does not exist
    cluster.kube.patch(VPN, "VPNPeer", "s1", {"spec": {"authorization": {"exposures": ["web", "nope"]}}}, ns)
    cond = wait_for(
        lambda: (c := condition(gateway(cluster), "ConfigRendered")) and c["status"] == "False" and c,
        10,
        "ConfigRendered=False",
    )
    assert cond["reason"] == "PartlyRendered"
    assert f'VPNPeer/{ns}/s1: spec.authorization.exposures[1]: "nope" names no exposure' in cond["message"]
    plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", ns))  # type: ignore[arg-type]
    grants = {(g.peer, g.exposure) for g in plan.nat.grants if g.kind == "exposure"}
    assert grants == {("s1", "web"), ("s2", "web")}, "db revoked, nope left out, the rest in force"
    events = wait_for(
        lambda: [e for e in cluster.kube.list("v1", "Event", ns) if e["reason"] == "PartlyRendered"],
        5,
        "the Event (written after the status)",
    )
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert events[0]["involvedObject"]["kind"] == "VPNGateway"


def test_injected_conflicts_and_a_410_are_survived(cluster: Cluster) -> None:
    ctl = start(cluster)
    cluster.kube.inject_fault(409, count=3, verb="create", resource="configmaps")
    cluster.kube.inject_fault(409, count=2, subresource="status", resource="vpngateways")
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object despite 409s")
    wait_for(lambda: condition(gateway(cluster), "ConfigRendered"), 10, "the status despite 409s")

    def counted() -> bool:
        """Every write the API accepted is in vpngw_controller_api_writes_total, also those of a reconcile
        whose status patch then met a 409 (they were lost from the count before)."""
        accepted = sum(1 for r in writes(cluster, 0) if r.user_agent == "vpngw-controller" and r.code < 400)
        return accepted == metric(ctl, "vpngw_controller_api_writes_total") and not (
            metric(ctl, "vpngw_controller_queue_depth")
        )

    wait_for(counted, 10, "the write counter to equal the writes the API accepted")
    cluster.kube.compact()
    cluster.kube.close_watches()  # every informer re-watches from a version the server no longer has: 410
    cluster.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, NS)

    def revoked() -> bool:
        plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", NS))  # type: ignore[arg-type]
        return not any(g.peer == "s2" for g in plan.nat.grants)

    wait_for(revoked, 15, "the change made across the 410")
    assert "informer.relist" in ctl.log() and ctl.proc.poll() is None


def test_the_api_server_away_for_30_s_is_survived_without_a_lost_change(cluster: Cluster) -> None:
    ctl = start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    cluster.kube.unreachable(30)
    # Another client's change lands while the controller cannot see the API (straight into the store).
    cluster.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, NS)
    wait_for(lambda: "informer.failed" in ctl.log(), 30, "the controller to meet the API gone")
    cluster.kube.wait_reachable()  # the outage lasts its 30 s; the controller has to find the API again

    def revoked() -> bool:
        plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", NS))  # type: ignore[arg-type]
        return not any(g.peer == "s2" for g in plan.nat.grants)

    wait_for(revoked, 30, "the change made while the API was away")
    assert ctl.proc.poll() is None, "still running"


def metric(ctl: Controller, name: str) -> float:
    """The sum of the samples named ``name`` (every label set) on the controller's /metrics."""
    _, text = ctl.get("/metrics")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_a_no_op_resync_writes_nothing(cluster: Cluster) -> None:
    ctl = cluster.start_controller(CONFIG, "--resync-seconds", "10")
    wait_for(ctl.ready, 30, "ready")
    apply_ipsec(cluster)
    apply_with_secrets(cluster, wireguard_docs(cluster))
    wait_for(lambda: converged(cluster) and converged(cluster, "acme-wg", "tenant-wg"), 20, "both gateways")

    def settled() -> bool:
        """The set-up's writes are done: both gateways have a status, every write the emulator logged from
        the controller is one its reconciles counted (the reconcile that made it has returned), and no
        gateway waits in the queue."""
        if not all(
            condition(gateway(cluster, *k), "Ready") for k in (("acme", NS), ("acme-wg", "tenant-wg"))
        ):
            return False
        # Writes the API accepted: a status patch refused as decided on a stale read (409) is decided
        # again, and counted only when it is written.
        logged = sum(1 for r in writes(cluster, 0) if r.user_agent == "vpngw-controller" and r.code < 400)
        counted = metric(ctl, "vpngw_controller_api_writes_total")
        return counted == logged and metric(ctl, "vpngw_controller_queue_depth") == 0

    wait_for(settled, 10, "the controller to settle")
    mark = seq(cluster)
    before = metric(ctl, "vpngw_controller_reconcile_total")
    # The periodic resync (every 10 s) reconciles both gateways again in the window, and writes nothing.
    wait_for(lambda: metric(ctl, "vpngw_controller_reconcile_total") >= before + 2, 25, "a resync of both")
    assert writes(cluster, mark) == []
    # The controller never gets a Secret: it lists and watches only those opted in for gateways, and keeps
    # their metadata (controller.informer.metadata_only).
    reads = [
        (r.verb, r.path)
        for r in cluster.kube.requests(resource="secrets")
        if r.user_agent == "vpngw-controller"
    ]
    assert reads and all(
        verb in ("list", "watch") and "labelSelector=vpn.bnerd.net%2Fgateway-secret%3Dtrue" in path
        for verb, path in reads
    ), reads


def test_deleting_the_gateway_releases_the_finalizer_and_the_objects_go_with_it(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    cluster.kube.delete(VPN, "VPNGateway", "acme", ns)
    wait_for(lambda: cluster.get(VPN, "VPNGateway", "acme", ns) is None, 10, "the gateway gone")
    wait_for(
        lambda: not any(cluster.owned(a, k, "acme", ns) for a, k in OWNED), 10, "owned objects collected"
    )


def test_a_gateway_gone_without_its_finalizer_leaves_no_pod_behind(cluster: Cluster) -> None:
    """Its finalizer removed by hand while the controller was away (or its CRD deleted): nothing in the
    gateway namespace can carry an ownerReference to the CR, so the controller deletes what names it."""
    ns = spelled(cluster, NS)
    ctl = start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    ctl.stop()
    cluster.kube.patch(VPN, "VPNGateway", "acme", {"metadata": {"finalizers": None}}, ns)
    cluster.kube.delete(VPN, "VPNGateway", "acme", ns)
    assert cluster.get(VPN, "VPNGateway", "acme", ns) is None
    assert all(cluster.owned(a, k, "acme", ns) for a, k in OWNED), "left behind while the controller is away"
    start(cluster)
    wait_for(
        lambda: not any(cluster.owned(a, k, "acme", ns) for a, k in OWNED), 20, "the orphans deleted at start"
    )


def pinned_to(cluster: Cluster, node: str) -> bool:
    return bool(gateway(cluster)["status"].get("nodeName") == node)


def test_the_controllers_and_the_agents_status_writes_do_not_clobber_each_other(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    node_a, node_b = nodes(cluster)
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: condition(gateway(cluster), "ConfigRendered"), 20, "the controller's status")
    stop = threading.Event()
    failed: list[BaseException] = []
    last = [0]  # the bytesIn of the agent's last accepted write

    def agent() -> None:  # the status-agent's merge patch of its own keys, ~100 times a second
        i = 0
        try:
            while not stop.is_set():
                i += 1
                tunnels = [{"name": "s1", "state": "Established", "bytesIn": i}]
                cluster.kube.patch(
                    VPN, "VPNGateway", "acme", {"status": {"tunnels": tunnels}}, ns, subresource="status"
                )
                last[0] = i
                stop.wait(0.01)  # ~100 writes/s: every controller write races several of them
        except BaseException as exc:  # raised again below: in a thread it would only be a warning
            failed.append(exc)

    t = threading.Thread(target=agent)
    t.start()
    try:
        for node in (node_a, node_b, node_a):  # the controller rewrites nodeName and conditions meanwhile
            cluster.set_node_ready(node_b if node == node_a else node_a, False)
            cluster.set_node_ready(node, True)
            wait_for(functools.partial(pinned_to, cluster, node), 30, f"pinned {node}")
    finally:
        stop.set()
        t.join()
    if failed:
        raise failed[0]
    # The agent writing every 10 ms would repair tunnels a controller write wiped before any check saw it:
    # with the agent stopped, the controller writes the status once more (a re-pin), and the agent's last
    # write must have survived it.
    cluster.set_node_ready(node_a, False)
    cluster.set_node_ready(node_b, True)
    wait_for(functools.partial(pinned_to, cluster, node_b), 30, "pinned node-b, the agent stopped")
    st = gateway(cluster)["status"]
    assert last[0] > 1 and st["tunnels"] == [{"name": "s1", "state": "Established", "bytesIn": last[0]}], st
    assert condition(gateway(cluster), "ConfigRendered") and st["publicIP"] == "203.0.113.10"


def test_legacy_and_wireguard_gateways_are_served_by_the_same_machinery(cluster: Cluster) -> None:
    wg = spelled(cluster, "tenant-wg")
    old = spelled(cluster, "tenant-old")
    start(cluster)
    apply_with_secrets(cluster, wireguard_docs(cluster))
    apply_with_secrets(cluster, legacy_docs(cluster))
    wait_for(lambda: converged(cluster, "acme-wg", wg), 20, "the WireGuard gateway's objects")
    wait_for(lambda: converged(cluster, "legacy", old, "IPsecGateway"), 20, "the legacy gateway's objects")
    # The status follows the objects (one reconcile writes both: the objects first).
    wait_for(
        lambda: (
            condition(gateway(cluster, "legacy", old, "IPsecGateway"), "ConfigRendered").get("status")
            == "True"
        ),
        10,
        "the legacy gateway's ConfigRendered",
    )
    dep = cluster.owned("apps/v1", "Deployment", "acme-wg", wg)
    names = [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]]  # type: ignore[index]
    assert names == ["init-nat-watch", "status-agent", "exporter"]


def test_a_gateway_refused_a_taken_service_cidr_takes_it_once_the_holder_is_deleted(cluster: Cluster) -> None:
    """Two gateways asking for one serviceCIDR: the younger is refused it (ServiceCIDRTaken), and takes it
    as soon as the older is deleted, not at the next resync (600 s here). Found on the real control plane,
    where a deleted gateway of an earlier test held the example's range while the next test's was made."""
    ns, wg = spelled(cluster, NS), spelled(cluster, "tenant-wg")
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object of the first gateway")
    docs = wireguard_docs(cluster)
    docs[0]["spec"]["serviceCIDR"] = gateway(cluster)["spec"]["serviceCIDR"]
    apply_with_secrets(cluster, docs)
    wait_for(
        lambda: (
            condition(gateway(cluster, "acme-wg", wg), "ConfigRendered").get("reason") == "ServiceCIDRTaken"
        ),
        20,
        "the second gateway refused the range",
    )
    assert cluster.owned("apps/v1", "Deployment", "acme-wg", wg) is None
    cluster.kube.delete(VPN, "VPNGateway", "acme", ns)
    wait_for(lambda: converged(cluster, "acme-wg", wg), 20, "the freed range taken by the second gateway")


def test_two_replicas_elect_one_leader_and_the_other_takes_over(cluster: Cluster) -> None:
    ns = spelled(cluster, NS)
    a = start(cluster, name="a")
    b = start(cluster, name="b")
    wait_for(
        lambda: "vpngw_controller_leader 1.0" in a.get("/metrics")[1] + b.get("/metrics")[1], 20, "a leader"
    )
    leader, standby = (a, b) if "vpngw_controller_leader 1.0" in a.get("/metrics")[1] else (b, a)
    assert "vpngw_controller_leader 0.0" in standby.get("/metrics")[1]
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "objects from the leader")
    assert "object.created" in leader.log() and "object.created" not in standby.log()
    leader.stop(signal.SIGKILL)
    cluster.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, ns)

    def revoked() -> bool:
        plan = plan_of(cluster.owned("v1", "ConfigMap", "acme", ns))  # type: ignore[arg-type]
        return not any(g.peer == "s2" for g in plan.nat.grants)

    wait_for(revoked, 40, "the standby to take over (lease 15 s) and reconcile the change")
    assert "leader.started" in standby.log()


def test_a_stopped_leader_hands_its_lease_over_at_once(cluster: Cluster) -> None:
    """SIGTERM (a rolling update): the leader stops its work, then gives the Lease up (no holder), and the
    standby leads at its next try, well inside the 15 s the lease would otherwise take to run out."""
    a = start(cluster, name="a")
    b = start(cluster, name="b")
    wait_for(
        lambda: "vpngw_controller_leader 1.0" in a.get("/metrics")[1] + b.get("/metrics")[1], 20, "a leader"
    )
    leader, standby = (a, b) if "vpngw_controller_leader 1.0" in a.get("/metrics")[1] else (b, a)
    assert leader.stop(signal.SIGTERM) == 0
    assert "leader.released" in leader.log()
    wait_for(lambda: "leader.started" in standby.log(), 8, "the standby to lead, long before 15 s")


def test_bad_settings_exit_2_naming_the_setting(tmp_path: Path, cluster: Cluster) -> None:
    bad = copy.deepcopy(CONFIG)
    bad["staticNICs"]["tenant-acme/acme"]["mac"] = "nope"  # type: ignore[index]
    ctl = cluster.start_controller(bad, name="bad")
    assert ctl.proc.wait(30) == 2
    assert "config.staticNICs.tenant-acme/acme.mac: 'nope' is not a MAC address" in ctl.log()
    ctl2 = cluster.start_controller(CONFIG, "--node-selector", "pool", name="bad2")
    assert ctl2.proc.wait(30) == 2 and "--node-selector: 'pool' is not label=value" in ctl2.log()


KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"


def test_kubectl_apply_of_the_example_then_get_vpngateways_shows_the_columns(cluster: Cluster) -> None:
    import subprocess

    ns = spelled(cluster, NS)
    start(cluster)
    kc = [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig)]
    assert subprocess.run([*kc, "create", "namespace", ns], capture_output=True, check=False).returncode == 0
    # The platform enables the tenant's namespace; without it the gateway takes no node and no cloud.
    labelled = [*kc, "label", "namespace", ns, f"{LABEL_TENANT}={TENANT_ENABLED}"]
    assert subprocess.run(labelled, capture_output=True, check=False).returncode == 0
    applied = subprocess.run(  # docs/examples/ipsec.yaml, in the cluster's spelling of its namespace
        [*kc, "apply", "-f", "-"],
        input=yaml.safe_dump_all(in_namespace(example_docs("ipsec.yaml"), ns)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    assert "vpngateway.vpn.bnerd.net/acme created" in applied.stdout
    wait_for(lambda: gateway(cluster).get("status", {}).get("publicIP"), 20, "the controller's status")
    out = subprocess.run(
        [*kc, "get", "vpngateways", "-n", ns], capture_output=True, text=True, check=True
    ).stdout
    header, row = out.splitlines()[:2]
    # TUNNELS is empty: no gateway pod runs here, so no status-agent writes status.tunnelsSummary.
    assert header.split() == ["NAME", "TYPE", "NODE", "PUBLIC", "IP", "READY", "TUNNELS", "AGE"]
    name, kind, node, public, ready = row.split()[:5]
    assert (name, kind, public, ready) == ("acme", "ipsec", "203.0.113.10", "False")
    assert node in nodes(cluster)


def test_a_gateway_in_a_namespace_not_enabled_takes_no_node_and_no_cloud_until_enabled(
    cluster: Cluster,
) -> None:
    """A CR in a namespace the platform has not enabled is refused whole: no plan, no pod, no node slot
    and no cloud step, so a namespace nobody vetted cannot take capacity every tenant shares."""
    ns = spelled(cluster, NS)
    start(cluster)
    cluster.namespace(ns, tenant=False)
    apply_ipsec(cluster)
    gw = wait_for(
        lambda: (
            (g := gateway(cluster)) and condition(g, "Ready").get("reason") == "NamespaceNotEnabled" and g
        ),
        20,
        "the refusal in the status",
    )
    assert condition(gw, "CloudReady").get("reason") == "NotRendered"
    assert condition(gw, "PodReady").get("reason") == "NotRendered", "not 'waiting for NIC2'"
    assert not gw["status"].get("publicIP") and not gw["status"].get("nodeName")
    assert cluster.owned("apps/v1", "Deployment", "acme", ns) is None
    assert cluster.owned("v1", "ConfigMap", "acme", ns) is None
    cluster.kube.patch("v1", "Namespace", ns, {"metadata": {"labels": {LABEL_TENANT: TENANT_ENABLED}}})
    wait_for(lambda: converged(cluster), 20, "every owned object once the namespace is enabled")
    wait_for(
        lambda: gateway(cluster).get("status", {}).get("publicIP") == NIC["publicIP"], 10, "the public IP"
    )
