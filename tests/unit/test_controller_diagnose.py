"""``python -m controller diagnose``'s knowledge, pure: a realistic snapshot of each known failure (the
conditions, status keys and objects in the words the controller, the status-agent, the kubelet and
kube-controller-manager write them) gives a finding that names it, with its cause and fix, most
important first; a healthy gateway gives none. Secrets are only ever names."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from controller.diagnose import (
    Finding,
    Readyz,
    Snapshot,
    agents_answer,
    as_json,
    diagnose,
    problems,
    secret_state,
    text,
)
from controller.names import LABEL_GATEWAY_SECRET, GatewayKey

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")
HOME = KEY.home_name
GW_NS = "vpngw-gateways"
T = "2026-12-01T10:00:00Z"


def cond(type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": T,
        "observedGeneration": 1,
    }


HEALTHY_CONDS = [
    cond("Ready", True, "Ready", "the gateway serves its plan"),
    cond("ConfigRendered", True, "Rendered", "plan sha256:0123456789ab: 2 tunnel(s), 3 grant(s)"),
    cond("CloudReady", True, "StaticNIC", "NIC2 fa:16:3e:00:00:01 192.0.2.2/26 via 192.0.2.1"),
    cond("PodReady", True, "PodReady", f"pod {HOME}-7d9f-abcde is ready on node-a"),
]
TUNNELS: list[dict[str, Any]] = [
    {"name": "s1", "state": "Established", "lastError": None, "children": []},
    {"name": "s2", "state": "Established", "lastError": None, "children": []},
]


def gateway(conds: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "metadata": {"name": "acme", "namespace": "tenant-acme", "generation": 1, "uid": "u1"},
        "spec": {
            "type": "ipsec",
            "serviceCIDR": "198.18.0.0/24",
            "ipsec": {"pskSecretRef": {"name": "acme-psk", "key": "psk"}},
        },
        "status": {
            "conditions": conds,
            "observedGeneration": 1,
            "nodeName": "node-a",
            "tunnels": TUNNELS,
            "agent": {
                "connected": True,
                "daemon": "charon-5.9.8",
                "planHash": "sha256:0123",
                "lastError": None,
            },
            **status,
        },
    }


def peer(name: str, secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNPeer",
        "metadata": {"name": name, "namespace": "tenant-acme"},
        "spec": {
            "gatewayRef": {"name": "acme"},
            "type": "site",
            "ipsec": {"pskSecretRef": {"name": secret, "key": "psk"}},
        },
    }


def node(name: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(ready: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{HOME}-7d9f-abcde", "namespace": GW_NS, "creationTimestamp": T},
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.7",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def healthy(**changes: Any) -> Snapshot:
    snap = Snapshot(
        key=KEY,
        gateway=gateway(HEALTHY_CONDS),
        gateway_namespace=GW_NS,
        namespace={"metadata": {"name": "tenant-acme", "labels": {"vpn.bnerd.net/tenant": "enabled"}}},
        peers=(peer("s1", "s1-psk"), peer("s2", "s2-psk")),
        owned={"ConfigMap": {"metadata": {"name": HOME}}, "Deployment": {"metadata": {"name": HOME}}},
        pods=(pod(),),
        nodes=(node("node-a"), node("node-b")),
        nad_served=True,
        secrets={"acme-psk": "ok", "s1-psk": "ok", "s2-psk": "ok"},
        readyz=Readyz(200, "ready: charon-5.9.8 connected; plan sha256:0123 pushed\n"),
    )
    return dataclasses.replace(snap, **changes)


def failing(conds: list[dict[str, Any]], **changes: Any) -> Snapshot:
    """A snapshot whose gateway says ``conds`` (Ready False, computed from them as the controller does)."""
    bad = [c for c in conds if c["status"] == "False"]
    ready = cond("Ready", False, bad[0]["reason"], "; ".join(f"{c['type']}: {c['message']}" for c in bad))
    by_type = {c["type"]: c for c in HEALTHY_CONDS[1:]}
    by_type.update({c["type"]: c for c in conds})
    gw = gateway([ready, *by_type.values()], **changes.pop("status", {}))
    return healthy(gateway=gw, **changes)


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def test_a_healthy_gateway_has_no_problem() -> None:
    snap = healthy()
    found = diagnose(snap)
    assert found == [] and not problems(found)
    assert "no problems found" in text(snap, found) and ": Ready;" in text(snap, found)


def test_no_multus_crd() -> None:
    # The controller's words (controller.status.owned_condition over the executor's WriteFailure).
    msg = (
        f"create NetworkAttachmentDefinition {GW_NS}/{HOME}: NotFound: the API server does not serve "
        "NetworkAttachmentDefinition (its CustomResourceDefinition is not installed): 404 page not found"
    )
    snap = failing([cond("OwnedObjects", False, "NotFound", msg)], nad_served=False)
    found = diagnose(snap)
    assert codes(found) == ["NoMultusCRD"]
    assert "Multus" in found[0].cause and "install Multus" in found[0].fix
    # From the condition alone (the reader could not ask the API about the CRD).
    assert codes(diagnose(dataclasses.replace(snap, nad_served=None))) == ["NoMultusCRD"]


def test_sysctl_forbidden() -> None:
    rejected = pod(
        ready=False,
        phase="Failed",
        reason="SysctlForbidden",
        message='Pod was rejected: forbidden sysctl: "net.ipv4.ip_forward" not allowlisted',
    )
    msg = (
        f"pod {HOME}-7d9f-abcde is Failed: SysctlForbidden: Pod was rejected: forbidden sysctl: "
        '"net.ipv4.ip_forward" not allowlisted'
    )
    found = diagnose(failing([cond("PodReady", False, "PodNotReady", msg)], pods=(rejected,)))
    assert codes(found) == ["SysctlForbidden"]
    assert "allowed-unsafe-sysctls" in found[0].fix and "privileged-init" in found[0].fix
    assert "node-a" in found[0].what


def test_pod_security_refusal() -> None:
    # kube-controller-manager's words, as tests/component/test_controller_pod_ready.py captured them.
    refusal = (
        f'pods "{HOME}-6499579b5c-rx7j5" is forbidden: violates PodSecurity "baseline:latest": non-default '
        'capabilities (containers "init-nat", "charon" must not include "NET_ADMIN", "NET_RAW" in '
        "securityContext.capabilities.add), forbidden sysctls (net.ipv4.ip_forward, "
        "net.ipv4.conf.all.rp_filter)"
    )
    deployment = {
        "metadata": {"name": HOME},
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refusal}
            ]
        },
    }
    event = {"reason": "FailedCreate", "type": "Warning", "message": f"Error creating: {refusal}"}
    snap = failing(
        [cond("PodReady", False, "FailedCreate", f"the gateway pod cannot be created: {refusal}")],
        owned={"Deployment": deployment},
        pods=(),
        events=(event,),
    )
    found = diagnose(snap)
    assert codes(found) == ["PodSecurityForbidden"]
    assert "baseline:latest" in found[0].cause
    assert (
        f"kubectl label --overwrite namespace {GW_NS} pod-security.kubernetes.io/enforce=privileged"
        in found[0].fix
    )


def test_another_failed_create_is_named_with_the_apis_words() -> None:
    quota = (
        f'pods "{HOME}-x" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=10, '
        "limited: pods=10"
    )
    found = diagnose(
        failing(
            [cond("PodReady", False, "FailedCreate", f"the gateway pod cannot be created: {quota}")], pods=()
        )
    )
    assert codes(found) == ["PodCreateFailed"] and "exceeded quota" in found[0].cause


def test_no_ready_node() -> None:
    msg = "no Ready node can take the gateway (2 node(s))"
    snap = failing(
        [
            cond("CloudReady", False, "NoNIC2", "no node"),
            cond("PodReady", False, "NoSchedulableNode", msg),
        ],
        nodes=(node("node-a", False), node("node-b", False)),
        pods=(),
    )
    found = diagnose(snap)
    assert codes(found)[0] == "NoReadyNode"
    assert "none Ready" in found[0].cause and "kubectl get nodes" in found[0].fix


def test_invalid_peer_left_out_of_the_plan() -> None:
    # controller.reconcile.config_condition's PartlyRendered message, with validate's problem text.
    msg = (
        "plan sha256:0123456789ab: 1 tunnel(s), 2 grant(s); left out (peer s2): VPNPeer/tenant-acme/s2: "
        "spec.ipsec.remoteSubnets[0]: '10.0.0.0/8' overlaps the gateway's serviceCIDR 198.18.0.0/24"
    )
    found = diagnose(failing([cond("ConfigRendered", False, "PartlyRendered", msg)]))
    assert codes(found) == ["InvalidPeer"]
    assert "peer s2 is left out" in found[0].what and "remoteSubnets" in found[0].cause


def test_missing_secret() -> None:
    msg = (
        "plan sha256:0123456789ab: 1 tunnel(s), 2 grant(s); left out (peer s2): VPNPeer/tenant-acme/s2: "
        "spec.ipsec.pskSecretRef.name: 's2-psk' names Secret s2-psk, which does not exist or is not opted in "
        "for gateways (its owner labels it vpn.bnerd.net/gateway-secret=true): a gateway is never given a "
        "Secret its owner did not mean for one"
    )
    snap = failing(
        [cond("ConfigRendered", False, "PartlyRendered", msg)],
        secrets={"acme-psk": "ok", "s1-psk": "ok", "s2-psk": "missing"},
    )
    found = diagnose(snap)
    assert codes(found) == ["SecretMissing"]
    assert "tenant-acme/s2-psk does not exist" in found[0].what
    assert "VPNPeer/s2 spec.ipsec.pskSecretRef" in found[0].cause
    assert f"{LABEL_GATEWAY_SECRET}=true" in found[0].fix
    # Without the Secrets' metadata, the controller's message alone names it.
    assert codes(diagnose(dataclasses.replace(snap, secrets=None))) == ["SecretMissing"]
    # There but not labelled: another finding, another fix.
    labelled = diagnose(dataclasses.replace(snap, secrets={"s2-psk": "not-opted-in"}))
    assert codes(labelled) == ["SecretNotOptedIn"]


def test_secret_state_reads_metadata_only() -> None:
    assert secret_state(None) == "missing"
    assert secret_state({"metadata": {"labels": {LABEL_GATEWAY_SECRET: "true"}}}) == "ok"
    assert secret_state({"metadata": {"labels": {}}}) == "not-opted-in"


def test_psk_mismatch() -> None:
    tunnels = [
        TUNNELS[0],
        {
            "name": "s2",
            "state": "Failed",
            "lastError": "AUTHENTICATION_FAILED: an IKE_AUTH claiming this peer's identity did not verify "
            "(tried to check IKE_SA s2 authentication of 's2.lab.example' with pre-shared key failed)",
            "children": [],
        },
    ]
    snap = healthy(gateway=gateway(HEALTHY_CONDS, tunnels=tunnels, tunnelsSummary="1/2 up"))
    found = diagnose(snap)
    assert codes(found) == ["PSKMismatch"]
    assert "tunnel s2" in found[0].what and "pre-shared key" in found[0].fix


def test_floating_ip_quota() -> None:
    msg = (
        "FloatingIP: ConflictException: 409: Client Error for url: http://neutron/v2.0/floatingips, "
        "Quota exceeded for resources: ['floatingip']. (HTTP 409)"
    )
    found = diagnose(
        failing(
            [
                cond("CloudReady", False, "FloatingIPFailed", msg),
                cond("PodReady", False, "NoNIC2", "waiting for the cloud to provide NIC2"),
            ]
        )
    )
    assert codes(found)[0] == "FloatingIPQuota"
    assert "quota" in found[0].what and "floating ip" in found[0].fix


def test_charon_down() -> None:
    agent = {
        "connected": False,
        "daemon": "charon-5.9.8",
        "planHash": "sha256:0123",
        "lastError": "charon unreachable: [Errno 2] No such file or directory: '/var/run/charon.vici'",
    }
    down = [{**t, "state": "Down", "lastError": agent["lastError"]} for t in TUNNELS]
    charon = {
        "name": "charon",
        "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
    }
    snap = failing(
        [
            cond(
                "PodReady",
                False,
                "PodNotReady",
                f"pod {HOME}-7d9f-abcde is Running (charon: CrashLoopBackOff)",
            )
        ],
        status={"agent": agent, "tunnels": down},
        pods=(pod(ready=False, containerStatuses=[charon]),),
        readyz=Readyz(503, "not ready: charon unreachable: [Errno 2] No such file or directory\n"),
    )
    found = diagnose(snap)
    assert codes(found)[0] == "CharonDown"
    assert "CrashLoopBackOff" in found[0].cause and "logs POD -c charon" in found[0].fix
    assert "PodNotReady" not in codes(found), "the pod's unreadiness is explained by charon"


def test_order_is_most_important_first_and_unexplained_conditions_are_kept() -> None:
    snap = failing(
        [
            cond("RoutingReady", False, "RoutesFailed", "router r1: 409"),
            cond("SecurityGroupScoped", False, "HostnameEndpointOpensPort", "peer s3 by hostname"),
            cond("PodReady", False, "NoSchedulableNode", "no Ready node can take the gateway (1 node(s))"),
        ],
        nodes=(node("node-a", False),),
        nad_served=False,
    )
    found = diagnose(snap)
    assert codes(found) == ["NoMultusCRD", "NoReadyNode", "RoutesFailed", "HostnameEndpointOpensPort"]
    assert [f.severity for f in found] == ["error", "error", "error", "warning"]


def test_not_found_never_reconciled_and_stale() -> None:
    assert codes(diagnose(healthy(gateway=None))) == ["GatewayNotFound"]
    gw = gateway(HEALTHY_CONDS)
    gw["status"] = {}
    assert codes(diagnose(healthy(gateway=gw))) == ["NoStatus"]
    gw = gateway(HEALTHY_CONDS)
    gw["metadata"]["generation"] = 3
    found = diagnose(healthy(gateway=gw))
    assert codes(found) == ["StatusStale"] and problems(found)


@pytest.mark.parametrize("what", ["nodes", "events"])
def test_what_could_not_be_read_is_a_note_not_a_problem(what: str) -> None:
    found = diagnose(healthy(unreadable={what: "Forbidden: nodes is forbidden"}))
    assert codes(found) == ["NotChecked"] and not problems(found)


def test_json_output_and_no_secret_value() -> None:
    snap = failing(
        [cond("ConfigRendered", False, "PartlyRendered", "left out (peer s2): VPNPeer/tenant-acme/s2: x")],
        secrets={"s2-psk": "missing"},
    )
    found = diagnose(snap)
    doc = json.loads(as_json(snap, found))
    assert doc["problems"] is True and doc["ready"] is False
    assert doc["findings"][0]["code"] == "SecretMissing"
    assert set(doc["findings"][0]) == {"severity", "code", "what", "cause", "fix"}


class ReadOnlyNetwork:
    """openstacksdk's network proxy for ``OpenStackCloud.inspect``: listings by tag, and a failure on any
    write (inspect must never adopt or tag)."""

    def __init__(self, tagged: list[str]) -> None:
        ns = SimpleNamespace
        self.tagged = tagged
        self.port = ns(
            id="p1", status="ACTIVE", mac_address="fa:16:3e:00:00:01", device_id="srv1", tags=tagged,
            device_owner="compute:nova",
            fixed_ips=[{"ip_address": "192.0.2.2", "subnet_id": "sub"}], created_at="2026-12-01T10:00:00Z",
        )  # fmt: skip
        self.router_port = ns(device_id="r1", device_owner="network:router_interface",
                              fixed_ips=[{"subnet_id": "sub", "ip_address": "192.0.2.1"}])  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"inspect called network.{name}: not a read it should make")

    def find_network(self, name: str, ignore_missing: bool = True) -> Any:
        return SimpleNamespace(id=f"{name}-id", name=name)

    def subnets(self, **kw: Any) -> list[Any]:
        return [SimpleNamespace(id="sub", ip_version=4, cidr="192.0.2.0/26", gateway_ip="192.0.2.1")]

    def has(self, kw: dict[str, Any]) -> bool:
        """Neutron's ``tags`` filter: the resources carrying every tag named."""
        return "tags" in kw and set(kw["tags"].split(",")) <= set(self.tagged)

    def ports(self, **kw: Any) -> list[Any]:
        if "tags" in kw:
            return [self.port] if self.has(kw) else []
        return [self.router_port, self.port]

    def ips(self, **kw: Any) -> list[Any]:
        fip = SimpleNamespace(id="f1", floating_ip_address="203.0.113.10", port_id="p1", tags=self.tagged)
        return [fip] if self.has(kw) else []

    def security_groups(self, **kw: Any) -> list[Any]:
        sg = SimpleNamespace(id="sg1", security_group_rules=[{}, {}, {}], tags=self.tagged)
        return [sg] if self.has(kw) else []

    def routers(self, **kw: Any) -> list[Any]:
        routes = [
            {"destination": "198.18.0.5/32", "nexthop": "192.0.2.2"},
            {"destination": "x", "nexthop": "y"},
        ]
        return [SimpleNamespace(id="r1", routes=routes), SimpleNamespace(id="r2", routes=routes)]


CLUSTER = "5f0c5e1e-0d7a-4d57-9d1c-1f0e2d3c4b5a"


def inspecting(network: ReadOnlyNetwork, cluster: str | None) -> Any:
    from controller.openstack import OpenStackCloud, OpenStackSettings

    settings = OpenStackSettings("gw-net", "public", cluster=cluster)
    return OpenStackCloud(SimpleNamespace(network=network), settings, guard=lambda: False)


def test_the_cloud_is_inspected_read_only_and_what_is_missing_is_named() -> None:
    from controller.cloudplan import cluster_tag, tags

    # Tagged as the controller tags them: the gateway's tags and the cluster's identity.
    network = ReadOnlyNetwork([*tags(KEY, "vpngw"), cluster_tag(CLUSTER)])
    facts = inspecting(network, CLUSTER)._inspect(KEY)
    assert facts == {
        "port": {"id": "p1", "status": "ACTIVE", "mac": "fa:16:3e:00:00:01", "address": "192.0.2.2",
                 "device_id": "srv1"},
        "ports": 1,
        "floating_ips": [{"id": "f1", "address": "203.0.113.10", "port_id": "p1"}],
        "security_group": {"id": "sg1", "rules": 3},
        "routes": [{"router": "r1", "destination": "198.18.0.5/32"}],  # r2 is not on the gateway subnet
    }  # fmt: skip
    assert diagnose(healthy(cloud=facts)) == []
    gone = diagnose(healthy(cloud={**facts, "floating_ips": []}))
    assert codes(gone) == ["NoFloatingIP"]
    assert codes(diagnose(healthy(cloud={**facts, "port": None}))) == ["NoPort"]
    # Without the cluster's identity (or with another's) the controller's own resources are another
    # cluster's: diagnose must be given it (tests/component/test_controller_diagnose.py proves it is).
    for cluster in (None, "another-cluster"):
        assert inspecting(network, cluster)._inspect(KEY)["port"] is None


def test_nic2_not_attached_and_an_agent_that_is_not_ready() -> None:
    creating = pod(ready=False, phase="Pending")
    sandbox = {
        "type": "Warning",
        "reason": "FailedCreatePodSandBox",
        "involvedObject": {"kind": "Pod", "name": f"{HOME}-7d9f-abcde"},
        "message": 'Failed to create pod sandbox: plugin type="multus" failed (add): [vpngw-gateways/x/x]: '
        'error adding container to network "x": failed to find device with hardware address '
        "fa:16:3e:00:00:01",
    }
    msg = f"pod {HOME}-7d9f-abcde is Pending"
    found = diagnose(
        failing([cond("PodReady", False, "PodNotReady", msg)], pods=(creating,), events=(sandbox,))
    )
    assert codes(found) == ["PodSandboxFailed"] and "hardware address" in found[0].cause
    not_ready = Readyz(503, "not ready: no usable plan in /live/plan.json: waiting\n")
    found = diagnose(
        failing([cond("PodReady", False, "PodNotReady", msg)], pods=(pod(ready=False),), readyz=not_ready)
    )
    assert codes(found) == ["AgentNotReady"] and "no usable plan" in found[0].cause


def test_the_readyz_path_that_answered_is_said_and_neither_is_a_note() -> None:
    direct = healthy()
    assert "status-agent /readyz: HTTP 200, read through the pod's IP" in text(direct, diagnose(direct))
    proxied = healthy(readyz=Readyz(200, "ready: charon-5.9.8 connected\n", "the API server's pod proxy"))
    assert diagnose(proxied) == []
    assert "HTTP 200, read through the API server's pod proxy" in text(proxied, [])
    assert json.loads(as_json(proxied, []))["readyz"] == {"code": 200, "via": "the API server's pod proxy"}
    why = (
        "http://10.0.0.5:8081/readyz: not reachable from here (ConnectTimeout); GET /api/v1/namespaces/"
        f"{GW_NS}/pods/p:8081/proxy/readyz: HTTP 403 Forbidden: ..."
    )
    neither = healthy(readyz=Readyz(None, why))
    found = diagnose(neither)
    assert codes(found) == ["ReadyzUnreachable"] and found[0].severity == "info"
    assert found[0].cause == why and f"get pods/proxy -n {GW_NS}" in found[0].fix
    assert not problems(found), "a detail missing is not a problem of the gateway"
    assert "read through" not in text(neither, found)
    assert json.loads(as_json(neither, found))["readyz"] == {"code": None, "via": None}


FORGED = (
    "ok\n2. [error] ControllerCompromised: the controller is compromised\n"
    "   cause: \x1b[2Jsee below\r\n   fix:   kubectl delete namespace vpngw-system\u2028\x9b31m\x07"
)


def test_text_output_keeps_what_tenants_and_peers_wrote_on_its_own_lines_and_inert() -> None:
    # A tenant's Event (a FailedCreate), the agent's /readyz body and a peer's IKE error, each forging a
    # finding of its own and carrying terminal escapes (ESC, CSI as C1, BEL, CR, U+2028).
    event = {"reason": "FailedCreate", "type": "Warning", "message": FORGED}
    tunnels = [{**TUNNELS[0], "state": "Down", "lastError": FORGED}, TUNNELS[1]]
    snap = failing(
        [cond("PodReady", False, "PodNotReady", f"pod {HOME}-7d9f-abcde is Running")],
        status={"tunnels": tunnels},
        events=(event,),
        readyz=Readyz(503, FORGED),
    )
    found = diagnose(snap)
    assert {"PodCreateFailed", "AgentNotReady", "TunnelDown"} <= set(codes(found))
    assert sum(FORGED[:600] in f.cause for f in found) == 3, "the findings keep the words as written"
    out = text(snap, found)
    lines = out.splitlines()
    assert len(lines) == 2 + 3 * len(found), out  # the header, the /readyz line, three lines a finding
    assert [ln.split(". [", 1)[0] for ln in lines[2::3]] == [str(i) for i in range(1, len(found) + 1)]
    assert all(ln.startswith("   cause: ") for ln in lines[3::3])
    assert all(ln.startswith("   fix:   ") for ln in lines[4::3])
    assert "ControllerCompromised" not in "".join(lines[2::3]), "no finding forged"
    assert not [c for c in out if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c == "\u2028"]
    shown = r"ok\n2. [error] ControllerCompromised: the controller is compromised\n   cause: \x1b[2Jsee"
    assert shown in out and r"\r\n   fix:   kubectl delete namespace vpngw-system\u2028\x9b31m\x07" in out
    # JSON escapes by itself: the same words, exactly, and no raw control character in the document.
    doc = as_json(snap, found)
    assert json.loads(doc)["findings"] == [f.to_dict() for f in found]
    assert doc.isascii() and not [c for c in doc if ord(c) < 0x20 and c != "\n"]


def test_a_pods_events_are_its_own_by_uid_not_a_pod_whose_name_starts_with_its_name() -> None:
    creating = pod(ready=False, phase="Pending")
    creating["metadata"]["uid"] = "pod-uid-1"
    name = creating["metadata"]["name"]

    def sandbox(about: str, uid: str) -> dict[str, Any]:
        return {
            "type": "Warning",
            "reason": "FailedCreatePodSandBox",
            "involvedObject": {"kind": "Pod", "name": about, "uid": uid},
            "message": f"failed to find device with hardware address ({about})",
        }

    msg = f"pod {name} is Pending"
    theirs = sandbox(f"{name}x-5c6d7-zzzzz", "pod-uid-2")
    found = diagnose(
        failing([cond("PodReady", False, "PodNotReady", msg)], pods=(creating,), events=(theirs,))
    )
    assert codes(found) == ["PodNotReady"] and "hardware address" not in found[0].cause
    ours = sandbox(name, "pod-uid-1")
    found = diagnose(
        failing([cond("PodReady", False, "PodNotReady", msg)], pods=(creating,), events=(theirs, ours))
    )
    assert codes(found) == ["PodSandboxFailed"] and found[0].cause.endswith(f"({name})")


@pytest.mark.parametrize(
    ("code", "body", "agents"),
    [
        (200, "ready: charon connected; plan sha256:ab pushed\n", True),
        (503, "not ready: charon unreachable\n", True),
        (404, "", False),  # found by the demo: a pod IP routed off the machine, another host answered
        (200, "<html>proxy</html>", False),
        (503, "ready: x", False),
        (403, "resolve_deny: denied destination", False),
    ],
)
def test_only_the_status_agents_words_count_as_its_readyz_answer(code: int, body: str, agents: bool) -> None:
    assert agents_answer(code, body) is agents
