"""The controller's pure reconcile: the objects, fields and status a gateway's snapshot asks for, for IPsec,
WireGuard and the legacy kind; plan changes that never touch the pod template; invalid input that keeps the
deployed plan; a world in order that asks for no write at all."""

from __future__ import annotations

import copy
import dataclasses
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import gwplan
from controller import desired as desired_module
from controller import diff
from controller.cloud import CloudState
from controller.desired import HOME_KINDS, Nic2, plan_of, slot_of
from controller.names import (
    ANNOTATION_HASH,
    ANNOTATION_NIC_MAC,
    FINALIZER,
    MULTUS_NETWORKS,
    GatewayKey,
    key_of,
)
from controller.placement import Placement
from controller.podspec import INITNAT_CAPS, IPSEC_CAPS, READONLY_DIR
from controller.reconcile import Decision, Snapshot, cleanup, decide, peers_of, render_gateway
from controller.settings import Allowance, GatewayPod, Settings, StaticNic
from controller.status import Condition, conditions
from tests.examples import edit, example_docs, mutate

NIC = Nic2("fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1")
GW_NS = "vpngw-gateways"
NOW = "2026-12-01T10:00:00Z"
LATER = "2026-12-01T11:00:00Z"
SETTINGS = Settings(
    internal_source_cidrs=("192.0.2.64/26",), default_allowance=Allowance(exposure_targets=("192.0.2.64/26",))
)
CLOUD = CloudState(NIC, "203.0.113.10", (Condition("CloudReady", True, "StaticNIC", "ok"),))
HERE = Placement("node-a", "Placed", "pinned to node node-a")


def stored(doc: Mapping[str, Any], uid: str = "uid-gw", generation: int = 1) -> dict[str, Any]:
    out = copy.deepcopy(dict(doc))
    out["metadata"] = {**out["metadata"], "uid": uid, "generation": generation, "resourceVersion": "7"}
    return out


def snapshot(
    docs: Sequence[Mapping[str, Any]], owned: Mapping[str, Any] | None = None, **kw: Any
) -> Snapshot:
    gateway = stored(docs[0])
    key = key_of(gateway)
    peers = peers_of(
        key, [stored(d, uid=f"uid-{d['metadata']['name']}") for d in docs[1:] if d["kind"] == "VPNPeer"]
    )
    return Snapshot(key=key, gateway=gateway, peers=peers, owned=owned or {}, **kw)


def run(
    snap: Snapshot,
    settings: Settings = SETTINGS,
    now: str = NOW,
    where: Placement = HERE,
    cloud: CloudState = CLOUD,
) -> Decision:
    return decide(snap, settings, render_gateway(snap, settings), where, cloud, now)


def by_kind(d: Decision) -> dict[str, dict[str, Any]]:
    """Slot -> object of every create (``controller.desired.slot_of``)."""
    return {slot_of(a.obj, GW_NS): a.obj for a in d.actions if isinstance(a, diff.Create)}


def written(d: Decision) -> dict[str, dict[str, Any]]:
    """Slot -> object of every create or replace."""
    return {slot_of(a.obj, GW_NS): a.obj for a in d.actions if isinstance(a, diff.Create | diff.Replace)}


def as_api_holds(objects: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the API would hold after creating ``objects``: server metadata and a defaulted field added."""
    out = {}
    for kind, obj in objects.items():
        o = copy.deepcopy(dict(obj))
        o["metadata"].update(uid=f"uid-{kind}", resourceVersion="11", creationTimestamp=NOW)
        if kind == "Deployment":
            o["spec"]["progressDeadlineSeconds"] = 600  # the API server's default
            o["status"] = {"replicas": 1}
        out[kind] = o
    return out


IPSEC = example_docs("ipsec.yaml")
WIREGUARD = example_docs("wireguard.yaml")
LEGACY = [d for d in example_docs("legacy-ipsecgateway.yaml") if d["kind"] == "IPsecGateway"]


HOME = GatewayKey("VPNGateway", "tenant-acme", "acme").home_name
SELECTOR = {
    "vpn.bnerd.net/gateway": "acme",
    "vpn.bnerd.net/gateway-kind": "VPNGateway",
    "vpn.bnerd.net/gateway-namespace": "tenant-acme",
}


def test_an_ipsec_gateway_gets_every_object_named_labelled_and_owned() -> None:
    """The pod and its objects in the operator's gateway namespace, labelled with whose they are (no
    ownerReference can cross namespaces); only the pod's rights in the tenant's namespace, owned."""
    d = run(snapshot(IPSEC))
    objs = by_kind(d)
    assert sorted(objs) == sorted(
        [
            "ConfigMap",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "NetworkPolicy",
            "NetworkAttachmentDefinition",
            "Deployment",
            "TenantRole",
            "TenantRoleBinding",
        ]
    )
    assert HOME.startswith("vpngw-acme-") and len(HOME) <= 63
    for slot, o in objs.items():
        md = o["metadata"]
        labels = md["labels"]
        assert labels["vpn.bnerd.net/gateway"] == "acme" and labels["vpn.bnerd.net/operator"] == "vpngw"
        assert labels["vpn.bnerd.net/gateway-namespace"] == "tenant-acme"
        assert len(md["annotations"][ANNOTATION_HASH]) == 20
        if slot.startswith("Tenant"):
            assert (md["name"], md["namespace"]) == ("vpngw-acme", "tenant-acme"), slot
            assert md["ownerReferences"] == [
                {
                    "apiVersion": "vpn.bnerd.net/v1alpha1",
                    "kind": "VPNGateway",
                    "name": "acme",
                    "uid": "uid-gw",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        else:
            assert (md["name"], md["namespace"]) == (HOME, GW_NS), slot
            assert "ownerReferences" not in md and labels["vpn.bnerd.net/owner-uid"] == "uid-gw", slot
    assert d.status is not None
    assert d.events == (), "a gateway on its way into being (no pod yet) is no news"


def test_home_names_never_meet_across_tenants() -> None:
    """``a-b``/``c`` and ``a``/``b-c`` would both be ``vpngw-a-b-c`` by concatenation."""
    one = GatewayKey("VPNGateway", "a-b", "c").home_name
    two = GatewayKey("VPNGateway", "a", "b-c").home_name
    assert one != two and one.startswith("vpngw-c-") and two.startswith("vpngw-b-c-")
    long = GatewayKey("IPsecGateway", "n" * 63, "g" * 63).home_name
    assert len(long) <= 63 and long.startswith("ipsecgw-ggg")


def test_the_plan_configmap_holds_the_rendered_plan_with_the_clouds_nic2() -> None:
    plan = plan_of(by_kind(run(snapshot(IPSEC)))["ConfigMap"])
    assert plan.nic == gwplan.Nic(mac=NIC.mac, address=NIC.address, gateway=NIC.gateway)
    assert [t.name for t in plan.ipsec.tunnels] == ["s1", "s2"]  # type: ignore[union-attr]
    for t in plan.ipsec.tunnels:  # type: ignore[union-attr]
        assert t.conn[t.name]["local_addrs"] == ["192.0.2.2"], "IKE leaves from NIC2, not by the pod's routes"
    assert plan.gateway == gwplan.GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-acme", "acme")


def test_a_large_plan_is_stored_gzipped_under_the_same_key() -> None:
    import controller.desired as desired_module

    small = by_kind(run(snapshot(IPSEC)))["ConfigMap"]
    assert "plan.json" in small["data"] and "binaryData" not in small
    old = desired_module.GZIP_ABOVE
    desired_module.GZIP_ABOVE = 100
    try:
        big = by_kind(run(snapshot(IPSEC)))["ConfigMap"]
    finally:
        desired_module.GZIP_ABOVE = old
    assert "data" not in big and "plan.json" in big["binaryData"]
    assert plan_of(big) == plan_of(small)


def test_the_gateway_pods_roles_allow_exactly_what_its_pod_does() -> None:
    objs = by_kind(run(snapshot(IPSEC)))
    assert objs["Role"]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [HOME],
            "verbs": ["get", "list", "watch"],
        },
    ], "in the gateway namespace: its plan, nothing else"
    assert objs["TenantRole"]["rules"] == [
        {
            "apiGroups": ["vpn.bnerd.net"],
            "resources": ["vpngateways/status"],
            "resourceNames": ["acme"],
            "verbs": ["patch"],
        },
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["acme-psk", "s1-psk"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["vpn.bnerd.net"],
            "resources": ["vpnpeers/status"],
            "resourceNames": ["s1", "s2"],
            "verbs": ["patch"],
        },
    ], "in the tenant's namespace: its CR's status, its planned peers' statuses and its Secrets"
    sa = [{"kind": "ServiceAccount", "name": HOME, "namespace": GW_NS}]
    for slot, role in (("RoleBinding", HOME), ("TenantRoleBinding", "vpngw-acme")):
        rb = objs[slot]
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}
        assert rb["subjects"] == sa
    assert objs["ServiceAccount"]["automountServiceAccountToken"] is False


def test_only_secrets_their_owners_opted_in_are_granted() -> None:
    """A CR can name any Secret of its namespace; the pod is granted only those labelled for gateways."""
    only_s1 = run(snapshot(IPSEC, secrets=frozenset({"s1-psk"})))
    role = written(only_s1)["TenantRole"]
    assert role["rules"][1]["resourceNames"] == ["s1-psk"]
    plan = plan_of(written(only_s1)["ConfigMap"])
    assert [t.name for t in plan.ipsec.tunnels] == ["s1"], "s2 (on the default, not opted in) is left out"  # type: ignore[union-attr]
    cond = {c["type"]: c for c in only_s1.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert (
        "SecretNotOptedIn" not in cond["message"]
        and "acme-psk, which does not exist or is not opted in" in cond["message"]
    )


def test_the_network_policy_admits_monitoring_in_and_only_dns_and_the_api_server_out() -> None:
    np = by_kind(run(snapshot(IPSEC)))["NetworkPolicy"]["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"]
    assert np["podSelector"] == {"matchLabels": SELECTOR}
    assert np["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 9100}, {"protocol": "TCP", "port": 8081}],
        }
    ]  # the exporter's and the status-agent's /metrics (the chart's PodMonitor: test_helm_chart.py)
    (api,) = np["egress"]  # every peer endpoint and target is an address: no DNS at all
    assert api == {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
    named = edit(IPSEC, 2, ["spec", "endpoint"], "vpn.s2.example")  # a hostname endpoint: charon resolves it
    dns, _ = by_kind(run(snapshot(named)))["NetworkPolicy"]["spec"]["egress"]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    host = edit(
        IPSEC, 0, ["spec", "exposures", 0, "target"], {"host": "web.svc.example"}
    )  # init-nat resolves it
    assert len(by_kind(run(snapshot(host)))["NetworkPolicy"]["spec"]["egress"]) == 2
    pinned = dataclasses.replace(
        SETTINGS,
        network_policy=dataclasses.replace(SETTINGS.network_policy, api_server=(("10.0.0.1/32", 6443),)),
    )
    np2 = by_kind(run(snapshot(IPSEC), pinned))["NetworkPolicy"]["spec"]
    assert np2["egress"][0] == {
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
        "ports": [{"protocol": "TCP", "port": 6443}],
    }


def test_the_nad_is_the_operators_template_with_nic2s_mac() -> None:
    nad = by_kind(run(snapshot(IPSEC)))["NetworkAttachmentDefinition"]
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "0.3.1",
        "name": HOME,
        "type": "host-device",
        "hwaddr": NIC.mac,
    }
    custom = '{"type": "macvlan", "master": "eth1", "mac": "$mac", "ns": "$namespace"}'
    s = dataclasses.replace(SETTINGS, pod=dataclasses.replace(SETTINGS.pod, nad_template=custom))
    nad2 = by_kind(run(snapshot(IPSEC), s))["NetworkAttachmentDefinition"]
    assert json.loads(nad2["spec"]["config"]) == json.loads(
        string.Template(custom).substitute(mac=NIC.mac, namespace=GW_NS)
    )


def containers(d: Decision) -> dict[str, dict[str, Any]]:
    spec = by_kind(d)["Deployment"]["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def test_the_ipsec_pod_is_pinned_multus_attached_and_each_container_has_its_privileges_only() -> None:
    dep = by_kind(run(snapshot(IPSEC)))["Deployment"]
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert spec["selector"] == {"matchLabels": SELECTOR}
    tmpl = spec["template"]
    assert json.loads(tmpl["metadata"]["annotations"][MULTUS_NETWORKS]) == [
        {"name": HOME, "namespace": GW_NS}
    ]
    assert tmpl["metadata"]["annotations"][ANNOTATION_NIC_MAC] == NIC.mac
    pod = tmpl["spec"]
    assert pod["nodeName"] == "node-a" and pod["serviceAccountName"] == HOME
    # Only the status-agent has API credentials: none in the pod, one projected volume in that container.
    assert pod["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 (a path)
    mounts = {
        c["name"]: {m["mountPath"] for m in c.get("volumeMounts", [])}
        for c in pod["initContainers"] + pod["containers"]
    }
    assert [n for n, m in mounts.items() if token in m] == ["status-agent"]
    assert {(t["key"], t["tolerationSeconds"]) for t in pod["tolerations"]} == {
        ("node.kubernetes.io/not-ready", 30),
        ("node.kubernetes.io/unreachable", 30),
    }
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_forward", "value": "1"},
        {"name": "net.ipv4.conf.all.rp_filter", "value": "2"},
    ]
    assert [c["name"] for c in pod["initContainers"]] == ["init-nat"]
    names = [c["name"] for c in pod["initContainers"] + pod["containers"]]
    assert len(names) == len(set(names)), "the API server refuses a name used twice across init and main"
    c = containers(run(snapshot(IPSEC)))
    assert list(c) == ["init-nat-watch", "charon", "status-agent", "exporter"]
    caps = {n: x["securityContext"]["capabilities"] for n, x in c.items()}
    assert caps["charon"] == {"drop": ["ALL"], "add": IPSEC_CAPS}
    assert caps["init-nat-watch"] == {"drop": ["ALL"], "add": INITNAT_CAPS}
    assert caps["status-agent"] == caps["exporter"] == {"drop": ["ALL"]}
    for name in ("status-agent", "exporter"):
        sc = c[name]["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (65532, 65532, True)
    for name, x in c.items():
        assert x["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert x["securityContext"]["readOnlyRootFilesystem"] is True, name
        assert x["resources"]["requests"] and x["resources"]["limits"]["memory"], name
    assert c["status-agent"]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8081}
    assert c["status-agent"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8081}
    assert c["exporter"]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9100}
    agent = c["status-agent"]["command"]
    assert agent[agent.index("--follow-configmap") + 1] == HOME and "--kube-status" in agent
    exporter = c["exporter"]["command"]
    assert exporter[exporter.index("--vici-socket") + 1] == f"{READONLY_DIR}/charon.vici", (
        "the relay, not charon's"
    )
    assert_exporter_reads_only(by_kind(run(snapshot(IPSEC))))


def assert_exporter_reads_only(objs: Mapping[str, Any]) -> None:
    """The exporter in either mode: 65532, no capabilities, and nothing mounted but the agent's read-only
    directory (read-only): not charon's control socket, not wireguard-go's, not the live directory with
    the Secrets, no hostPath. The agent serves that directory (--readonly-dir, mounted writable)."""
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in pod["containers"]}
    sc = c["exporter"]["securityContext"]
    assert sc == {
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["exporter"]["volumeMounts"] == [
        {"name": "readonly", "mountPath": READONLY_DIR, "readOnly": True}
    ]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["readonly"] == {"name": "readonly", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
    cmd = c["exporter"]["command"]
    assert cmd[cmd.index("--plan") + 1] == f"{READONLY_DIR}/plan.json"
    agent = c["status-agent"]
    assert agent["command"][agent["command"].index("--readonly-dir") + 1] == READONLY_DIR
    assert {"name": "readonly", "mountPath": READONLY_DIR} in agent["volumeMounts"]
    for x in pod["containers"] + pod["initContainers"]:
        if x["name"] not in ("exporter", "status-agent"):
            assert "readonly" not in {m["name"] for m in x.get("volumeMounts", [])}, x["name"]


def test_a_wireguard_pod_has_no_charon_its_agent_runs_as_root_and_its_exporter_does_not() -> None:
    d = run(snapshot(WIREGUARD))
    c = containers(d)
    assert list(c) == ["init-nat-watch", "status-agent", "exporter"]
    assert c["status-agent"]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert c["status-agent"]["securityContext"]["runAsUser"] == 0
    assert "--wireguard-uapi-dir" in c["status-agent"]["command"]
    exporter = c["exporter"]["command"]
    assert exporter[exporter.index("--wireguard-interface") + 1] == "wg0"
    assert exporter[exporter.index("--wireguard-uapi-dir") + 1] == READONLY_DIR, "the agent's socket"
    assert_exporter_reads_only(by_kind(d))
    role = by_kind(d)["TenantRole"]
    assert role["rules"][1]["resourceNames"] == ["acme-wg", "s1-wg"]
    go = dataclasses.replace(SETTINGS, pod=dataclasses.replace(SETTINGS.pod, wireguard="wireguard-go"))
    d2 = run(snapshot(WIREGUARD), go)
    c2 = containers(d2)
    assert list(c2) == ["init-nat-watch", "wireguard-go", "status-agent", "exporter"]
    assert c2["wireguard-go"]["command"] == ["wireguard-go", "-f", "wg0"]
    vols = {v["name"]: v for v in by_kind(d2)["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert vols["tun"] == {"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}}
    assert_exporter_reads_only(by_kind(d2))


def test_a_legacy_gateway_gets_its_own_names_and_its_kinds_status_right() -> None:
    d = run(snapshot(LEGACY))
    objs = by_kind(d)
    home = GatewayKey("IPsecGateway", "tenant-old", "legacy").home_name
    assert {o["metadata"]["name"] for o in objs.values()} == {"ipsecgw-legacy", home}
    assert objs["TenantRole"]["rules"][0]["resources"] == ["ipsecgateways/status"]
    assert not any("vpnpeers/status" in r["resources"] for r in objs["TenantRole"]["rules"]), "no VPNPeers"
    assert objs["TenantRole"]["rules"][0]["apiGroups"] == ["ipsec.bnerd.net"]
    assert objs["TenantRole"]["metadata"]["ownerReferences"][0]["kind"] == "IPsecGateway"
    assert objs["ConfigMap"]["metadata"]["labels"]["vpn.bnerd.net/gateway-kind"] == "IPsecGateway"
    assert "charon" in containers(d)


def applied(d: Decision) -> dict[str, dict[str, Any]]:
    return as_api_holds(by_kind(d))


def template(d: Decision, owned: Mapping[str, Any]) -> Any:
    """The Deployment's pod template after ``d`` (created or replaced, else as it was)."""
    for a in d.actions:
        if isinstance(a, diff.Create | diff.Replace) and a.obj["kind"] == "Deployment":
            return a.obj["spec"]["template"]
    return owned["Deployment"]["spec"]["template"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda docs: docs[:2], id="peer-removed"),
        pytest.param(
            lambda docs: edit(docs, 2, ["spec", "authorization", "exposures"], []), id="grant-revoked"
        ),
        pytest.param(
            lambda docs: edit(docs, 2, ["spec", "ipsec", "pskSecretRef"], {"name": "s2-psk", "key": "psk"}),
            id="psk-secret-ref-added",
        ),
        pytest.param(
            lambda docs: [
                *docs,
                {
                    **copy.deepcopy(docs[2]),
                    "metadata": {"name": "s3", "namespace": "tenant-acme"},
                    "spec": {
                        **docs[2]["spec"],
                        "endpoint": "198.51.100.10",
                        "ipsec": {"id": "s3.lab.example", "remoteSubnets": ["203.0.113.32/28"]},
                    },
                },
            ],
            id="peer-added",
        ),
    ],
)
def test_a_plan_change_rewrites_the_plan_and_role_but_never_the_pod_template(change: Any) -> None:
    first = run(snapshot(IPSEC))
    owned = applied(first)
    d = run(snapshot(change(IPSEC), owned=owned))
    changed = {slot_of(a.obj, GW_NS) for a in d.actions if isinstance(a, diff.Replace)}
    assert "ConfigMap" in changed
    assert "Deployment" not in changed
    assert template(d, owned) == owned["Deployment"]["spec"]["template"]


@pytest.mark.parametrize(
    "settings, where, cloud",
    [
        pytest.param(
            dataclasses.replace(SETTINGS, pod=GatewayPod(image="localhost/vpngw-gateway:0.2.0")),
            HERE,
            CLOUD,
            id="image",
        ),
        pytest.param(
            SETTINGS, Placement("node-b", "Repinned", "moved", moved_from="node-a"), CLOUD, id="node"
        ),
        pytest.param(
            SETTINGS,
            HERE,
            dataclasses.replace(CLOUD, nic=dataclasses.replace(NIC, mac="fa:16:3e:00:00:99")),
            id="nic2-mac",
        ),
    ],
)
def test_image_placement_and_nic2_changes_roll_the_pod(
    settings: Settings, where: Placement, cloud: CloudState
) -> None:
    owned = applied(run(snapshot(IPSEC)))
    d = run(snapshot(IPSEC, owned=owned), settings, where=where, cloud=cloud)
    assert template(d, owned) != owned["Deployment"]["spec"]["template"]


def test_a_world_in_order_asks_for_no_write() -> None:
    first = run(snapshot(IPSEC))
    owned = applied(first)
    gw = dict(snapshot(IPSEC).gateway)
    gw["metadata"]["finalizers"] = [FINALIZER]
    gw["status"] = {**(gw.get("status") or {}), **(first.status or {})}
    again = run(dataclasses.replace(snapshot(IPSEC, owned=owned), gateway=gw), now=LATER)
    assert again.actions == () and again.status is None and again.events == ()


def test_an_edited_or_deleted_owned_object_is_restored_and_others_fields_are_kept() -> None:
    owned = applied(run(snapshot(IPSEC)))
    edited = copy.deepcopy(owned)
    edited["Role"]["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]})
    edited["Role"]["metadata"]["labels"]["team"] = "theirs"
    del edited["NetworkPolicy"]
    d = run(snapshot(IPSEC, owned=edited))
    kinds = {(type(a).__name__, slot_of(a.obj, GW_NS)) for a in d.actions if not isinstance(a, diff.Delete)}
    assert kinds == {("Replace", "Role"), ("Create", "NetworkPolicy")}
    role = next(a.obj for a in d.actions if isinstance(a, diff.Replace))
    assert role["rules"] == owned["Role"]["rules"], "our rules are back"
    assert role["metadata"]["labels"]["team"] == "theirs", "labels others add are kept"
    assert role["metadata"]["resourceVersion"] == "11", "replaced on the version we decided on"


def test_an_object_of_our_name_that_we_do_not_own_is_never_touched() -> None:
    owned = applied(run(snapshot(IPSEC)))
    theirs = copy.deepcopy(owned)
    del theirs["ConfigMap"]["metadata"]["labels"]["vpn.bnerd.net/owner-uid"]  # no owner-uid label
    theirs["ConfigMap"]["data"] = {"x": "y"}
    theirs["TenantRole"]["metadata"]["ownerReferences"] = []  # no ownerReference
    d = run(snapshot(IPSEC, owned=theirs))
    assert "ConfigMap" not in written(d) and "TenantRole" not in written(d)
    assert d.foreign == (
        diff.Foreign("Role", "tenant-acme/vpngw-acme"),
        diff.Foreign("ConfigMap", f"{GW_NS}/{HOME}"),
    )
    conds = {c["type"]: c for c in d.status["conditions"]}  # type: ignore[index]
    assert conds["OwnedObjects"]["reason"] == "ObjectNameTaken" and conds["Ready"]["status"] == "False"


def written_plan(d: Decision, owned: Mapping[str, Any]) -> gwplan.Plan:
    """The plan the ConfigMap holds after ``d``."""
    for a in d.actions:
        if isinstance(a, diff.Create | diff.Replace) and a.obj["kind"] == "ConfigMap":
            return plan_of(a.obj)
    return plan_of(owned["ConfigMap"])


def test_an_invalid_peer_or_grant_is_left_out_and_the_rest_is_rendered() -> None:
    """Fail closed per item: the invalid part goes, and so does a revocation made in the same edit."""
    owned = applied(run(snapshot(IPSEC)))
    bad = edit(IPSEC, 1, ["spec", "authorization", "exposures"], ["web", "nope"])  # db revoked, nope unknown
    bad = edit(bad, 2, ["spec", "ipsec", "remoteSubnets"], ["203.0.113.0/28"])  # overlaps s1's: s2 goes
    d = run(snapshot(bad, owned=owned))
    plan = written_plan(d, owned)
    assert plan.ipsec is not None
    assert [t.name for t in plan.ipsec.tunnels] == ["s1"], "s2 is left out: its tunnel goes"
    assert {(g.peer, g.exposure) for g in plan.nat.grants} == {("s1", "web"), ("s1", "printer")}
    assert [s.id for s in plan.ipsec.secrets] == ["psk-s1"]
    cond = {c["type"]: c for c in d.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert (cond["status"], cond["reason"]) == ("False", "PartlyRendered")
    assert "left out (grant exposure/s1/nope, peer s2)" in cond["message"]
    nope = 'VPNPeer/tenant-acme/s1: spec.authorization.exposures[1]: "nope" names no exposure'
    assert nope in cond["message"]
    assert "VPNPeer/tenant-acme/s2: spec.ipsec.remoteSubnets[0]" in cond["message"]
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "PartlyRendered")]


def test_a_schema_invalid_peer_is_left_out_alone() -> None:
    owned = applied(run(snapshot(IPSEC)))
    bad = edit(IPSEC, 2, ["spec", "ipsec", "remoteSubnets", 0], "203.0.113.16/33")
    d = run(snapshot(bad, owned=owned))
    plan = written_plan(d, owned)
    assert plan.ipsec is not None and [t.name for t in plan.ipsec.tunnels] == ["s1"]
    assert not any(g.peer == "s2" for g in plan.nat.grants)
    cond = {c["type"]: c for c in d.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert "left out (peer s2)" in cond["message"] and "is not an IPv4 CIDR" in cond["message"]


def test_an_invalid_gateway_keeps_the_deployed_plan_but_nothing_removed_or_revoked_since() -> None:
    """A gateway field may break and keep the deployed plan; a peer deleted, a grant revoked, an exposure
    removed or a PSK reference changed in the meantime still takes effect."""
    owned = applied(run(snapshot(IPSEC)))
    deployed = plan_of(owned["ConfigMap"])
    bad = edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.0.0/33")  # the gateway is invalid
    bad = edit(bad, 0, ["spec", "exposures"], [bad[0]["spec"]["exposures"][0]])  # db removed
    bad = edit(bad, 1, ["spec", "authorization", "reverseExposures"], [])  # s1's printer revoked
    bad = edit(bad, 1, ["spec", "ipsec", "pskSecretRef"], {"name": "s1-psk-new", "key": "psk"})
    d = run(snapshot(bad[:2], owned=owned))  # s2 deleted
    kept = written_plan(d, owned)
    assert kept.ipsec is not None
    # s2 is deleted; s1's old PSK reference is revoked material, so s1 goes whole
    assert kept.ipsec.tunnels == () and kept.ipsec.secrets == ()
    assert kept.nat.grants == ()
    assert [e.name for e in kept.nat.exposures] == ["web"]
    assert kept.nat.exposures[0].virtual_ip == deployed.nat.exposures[1].virtual_ip, "allocations kept"
    cond = {c["type"]: c for c in d.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert cond["status"] == "False" and "spec.serviceCIDR" in cond["message"]
    assert "keeps running, without what was removed or revoked since" in cond["message"]
    # Nothing removed: the deployed plan stays as it is, and nothing is written.
    unchanged = run(snapshot(edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.0.0/33"), owned=owned))
    assert "ConfigMap" not in written(unchanged)


@pytest.mark.parametrize(
    ("docs", "i", "path", "value"),
    [
        pytest.param(IPSEC, 1, ["spec", "ipsec", "id"], "s1-new.lab.example", id="ipsec-id"),
        pytest.param(IPSEC, 1, ["spec", "ipsec", "remoteSubnets"], ["203.0.113.0/28"], id="ipsec-subnets"),
        pytest.param(IPSEC, 1, ["spec", "endpoint"], "198.51.100.9", id="ipsec-endpoint"),
        pytest.param(IPSEC, 1, ["spec", "type"], "roadWarrior", id="ipsec-site-to-road-warrior"),
        pytest.param(
            WIREGUARD, 1, ["spec", "wireguard", "allowedIPs"], ["10.99.0.2/32"], id="wg-allowed-ips"
        ),
        pytest.param(LEGACY, 0, ["spec", "tunnels", 0, "peer", "id"], "s1-new.lab.example", id="legacy-id"),
        pytest.param(
            LEGACY, 0, ["spec", "tunnels", 0, "remoteSubnets"], ["198.19.1.16/28"], id="legacy-subnets"
        ),
    ],
)
def test_an_invalid_gateway_drops_a_peer_whose_connection_changed_since(
    docs: list[dict[str, Any]], i: int, path: list[str | int], value: Any
) -> None:
    """An id changed because the old one leaked, a subnet taken back: the deployed connection is no
    longer what is asked, so it goes with the gateway refused; its unchanged sibling stays."""
    owned = applied(run(snapshot(docs)))
    bad = edit(docs, 0, ["spec", "serviceCIDR"], "198.18.0.0/33")
    kept = written_plan(run(snapshot(edit(bad, i, path, value), owned=owned)), owned)
    names = [t.name for t in kept.ipsec.tunnels] if kept.ipsec else [p.name for p in kept.wireguard.peers]  # type: ignore[union-attr]
    assert names == (["laptop"] if docs is WIREGUARD else ["s2"])
    unchanged = run(snapshot(bad, owned=owned))
    assert "ConfigMap" not in written(unchanged), "nothing changed: the deployed plan stays whole"


def test_a_gateway_too_large_for_a_config_map_keeps_its_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan the API server would refuse (a ConfigMap over 1 MiB; here the limit is lowered so that a
    few hundred peers reach it) is never written: the write would fail on every reconcile. The gateway
    keeps its deployed plan, without what was removed since."""
    owned = applied(run(snapshot(IPSEC)))
    monkeypatch.setattr(desired_module, "CONFIG_MAP_MAX", 24 * 1024)
    many = []
    for i in range(300):
        p = edit([IPSEC[2]], 0, ["metadata", "name"], f"site-{i}")[0]
        p = mutate(p, ["spec", "ipsec", "id"], f"site-{i}.lab.example")
        many.append(mutate(p, ["spec", "ipsec", "remoteSubnets"], [f"10.{i // 256}.{i % 256}.0/24"]))
    d = run(snapshot([*IPSEC[:2], *many], owned=owned))  # and s2 deleted
    cond = {c["type"]: c for c in d.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert (cond["status"], cond["reason"]) == ("False", "PlanTooLarge")
    assert "the API server takes at most 24576: split its peers over more gateways" in cond["message"]
    kept = written_plan(d, owned)
    assert kept.ipsec is not None and [t.name for t in kept.ipsec.tunnels] == ["s1"], "s2's deletion holds"


def test_a_schema_invalid_gateway_is_reported_without_touching_anything() -> None:
    owned = applied(run(snapshot(IPSEC)))
    bad = edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.0.0/33")
    d = run(snapshot(bad, owned=owned))
    assert d.actions == ()
    cond = {c["type"]: c for c in d.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert "spec.serviceCIDR" in cond["message"] and cond["reason"] != "Rendered"


def test_conditions_keep_their_transition_time_and_events_come_only_with_changes() -> None:
    first = run(snapshot(IPSEC))
    gw = dict(snapshot(IPSEC).gateway)
    gw["status"] = first.status
    pod_ready = [
        {
            "metadata": {"name": "p", "creationTimestamp": NOW},
            "spec": {"nodeName": "node-a"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    ]
    later = run(dataclasses.replace(snapshot(IPSEC), gateway=gw, pods=tuple(pod_ready)), now=LATER)
    conds = {c["type"]: c for c in later.status["conditions"]}  # type: ignore[index]
    assert conds["PodReady"]["status"] == "True" and conds["PodReady"]["lastTransitionTime"] == LATER
    assert conds["ConfigRendered"]["lastTransitionTime"] == NOW, "unchanged status keeps its time"
    assert conds["Ready"]["status"] == "True"
    assert sorted(e.reason for e in later.events) == ["PodReady", "Ready"]


def test_an_open_security_group_is_said_but_does_not_make_the_gateway_unready() -> None:
    parts = [
        Condition("ConfigRendered", True, "Rendered", "ok"),
        Condition("SecurityGroupScoped", False, "HostnameEndpointOpensPort", "peer b: 0.0.0.0/0"),
    ]
    conds = {c["type"]: c for c in conditions(parts, [], 1, NOW)}
    assert conds["SecurityGroupScoped"]["status"] == "False"
    assert conds["Ready"]["status"] == "True"
    routing = [*parts, Condition("RoutingReady", False, "RouterNotAllowed", "router r")]
    ready = conditions(routing, [], 1, NOW)[0]
    assert ready["status"] == "False" and ready["reason"] == "RouterNotAllowed"
    assert "SecurityGroupScoped" not in ready["message"]


def test_without_nic2_nothing_that_needs_it_is_made_and_a_running_pod_is_left_alone() -> None:
    none = CloudState(None, None, (Condition("CloudReady", False, "NoStaticNIC", "no entry"),))
    d = run(snapshot(IPSEC), cloud=none)
    assert set(by_kind(d)) == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "TenantRole",
        "TenantRoleBinding",
        "NetworkPolicy",
    }
    owned = applied(run(snapshot(IPSEC)))
    d2 = run(snapshot(IPSEC, owned=owned), cloud=none)
    assert not set(written(d2)) & {"ConfigMap", "Deployment", "NetworkAttachmentDefinition"}


def test_without_a_node_the_deployment_is_held_and_the_status_says_why() -> None:
    owned = applied(run(snapshot(IPSEC)))
    nowhere = Placement(None, "NoSchedulableNode", "no Ready node can take the gateway (2 node(s))")
    d = run(snapshot(IPSEC, owned=owned), where=nowhere)
    assert "Deployment" not in written(d)
    conds = {c["type"]: c for c in d.status["conditions"]}  # type: ignore[index]
    assert conds["PodReady"]["reason"] == "NoSchedulableNode"
    assert d.status["nodeName"] == "node-a", "the status keeps the node the Deployment still names"  # type: ignore[index]


def test_the_key_of_a_gateway_and_its_object_names() -> None:
    assert GatewayKey("VPNGateway", "t", "hq").object_name == "vpngw-hq"
    assert GatewayKey("IPsecGateway", "t", "hq").object_name == "ipsecgw-hq"
    assert key_of({"kind": "IPsecGateway", "metadata": {"namespace": "t", "name": "x"}}) == GatewayKey(
        "IPsecGateway", "t", "x"
    )


def test_static_nic_settings_are_validated_naming_the_entry() -> None:
    from controller.settings import SettingsError, from_config

    ok = from_config(
        {
            "staticNICs": {
                "t/hq": {
                    "mac": "FA:16:3E:00:00:01",
                    "address": "192.0.2.2/26",
                    "gateway": "192.0.2.1",
                    "publicIP": "203.0.113.5",
                }
            }
        }
    )
    assert ok.static_nics["t/hq"] == StaticNic(
        "fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1", "203.0.113.5"
    )
    with pytest.raises(
        SettingsError, match=r"config.staticNICs.t/hq.gateway: 192.0.2.99 is not on 192.0.2.0/30"
    ):
        from_config(
            {
                "staticNICs": {
                    "t/hq": {"mac": "fa:16:3e:00:00:01", "address": "192.0.2.2/30", "gateway": "192.0.2.99"}
                }
            }
        )
    with pytest.raises(SettingsError, match="nadTemplate: must contain"):
        from_config({"gatewayPod": {"nadTemplate": '{"type": "host-device"}'}})
    with pytest.raises(SettingsError, match=r"config: unknown key\(s\) gatewayPods"):
        from_config({"gatewayPods": {}})


def test_a_key_someone_adds_to_the_plan_configmap_is_removed() -> None:
    """The plan ConfigMap is the controller's whole: a second plan planted in binaryData (which a reader
    might prefer) goes at once."""
    owned = applied(run(snapshot(IPSEC)))
    planted = copy.deepcopy(owned)
    planted["ConfigMap"]["binaryData"] = {"plan.json": "H4sIAAAAAAAA"}
    planted["ConfigMap"]["data"]["extra"] = "x"
    d = run(snapshot(IPSEC, owned=planted))
    cm = written(d)["ConfigMap"]
    assert "binaryData" not in cm and cm["data"] == owned["ConfigMap"]["data"]
    assert run(snapshot(IPSEC, owned=owned)).actions == (), "in order: nothing written"


def leftover(kind: str, uid: str = "uid-gw") -> dict[str, Any]:
    """What the previous release made in the tenant's namespace."""
    ref = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "name": "acme",
        "uid": uid,
        "controller": True,
    }
    md = {"name": "vpngw-acme", "namespace": "tenant-acme", "uid": f"old-{kind}", "ownerReferences": [ref]}
    return {"kind": kind, "metadata": md}


def test_an_earlier_releases_objects_in_the_tenant_namespace_are_deleted_and_its_pod_awaited() -> None:
    old_pod = {"metadata": {"name": "vpngw-acme-x", "namespace": "tenant-acme", "labels": {}}, "spec": {}}
    snap = snapshot(
        IPSEC,
        leftovers=(leftover("Deployment"), leftover("ConfigMap"), leftover("Service", "other")),
        pods=(old_pod,),
    )
    d = run(snap)
    deletes = [(a.kind, a.namespace, a.name, a.uid) for a in d.actions if isinstance(a, diff.Delete)]
    assert deletes == [
        ("Deployment", "tenant-acme", "vpngw-acme", "old-Deployment"),
        ("ConfigMap", "tenant-acme", "vpngw-acme", "old-ConfigMap"),
    ], "ours only, each with its uid as the precondition"
    assert "Deployment" not in written(d), "the new pod waits until the old one let go of NIC2"
    assert "ConfigMap" in written(d)
    moved = run(snapshot(IPSEC))
    assert "Deployment" in written(moved)
    off = dataclasses.replace(SETTINGS, migrate=False)
    assert not [a for a in run(snap, off).actions if isinstance(a, diff.Delete)]


def test_the_finalizer_deletes_the_objects_in_the_gateway_namespace() -> None:
    owned = applied(run(snapshot(IPSEC)))
    gone = cleanup(snapshot(IPSEC, owned=owned, leftovers=(leftover("NetworkPolicy"),)))
    assert sorted((d.kind, d.namespace) for d in gone) == sorted(
        [(k, GW_NS) for k in HOME_KINDS] + [("NetworkPolicy", "tenant-acme")]
    ), "the tenant-side Role and RoleBinding go with their ownerReference"


def test_a_namespace_not_enabled_or_whose_secrets_cannot_be_read_renders_nothing() -> None:
    off = run(snapshot(IPSEC, namespace_enabled=False))
    cond = {c["type"]: c for c in off.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert cond["reason"] == "NamespaceNotEnabled" and "vpn.bnerd.net/tenant=enabled" in cond["message"]
    assert "ConfigMap" not in written(off)
    blind = run(
        snapshot(IPSEC, secrets_unreadable="the controller cannot list the Secrets of namespace tenant-acme")
    )
    cond = {c["type"]: c for c in blind.status["conditions"]}["ConfigRendered"]  # type: ignore[index]
    assert cond["reason"] == "SecretsUnreadable"
