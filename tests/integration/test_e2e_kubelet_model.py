"""The lab kubelet's pure decisions (lab/kubelet/model.py, adapt.py, services.dns_answer, netpol.py,
capture.Tracker): no namespaces, no daemons (no ``lab`` marker); the e2e tests show them at work."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from lab.kubelet import adapt, capture, model, netpol
from lab.kubelet.services import dns_answer
from lab.kubelet.volumes import quantity_bytes


def deployment(image: str = "a", replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "d", "namespace": "n", "uid": "u1", "generation": 3},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    }


def pod(name: str, h: str, *, deleting: bool = False, ready: bool = False) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": {model.TEMPLATE_HASH_LABEL: h}}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": md,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_recreate_deletes_the_old_template_waits_for_it_then_creates_one() -> None:
    d = deployment()
    h = model.template_hash(d["spec"]["template"])
    assert model.deployment_step(d, []) == ("create", [])
    assert model.deployment_step(d, [pod("old", "x")]) == ("delete-old", ["old"])
    assert model.deployment_step(d, [pod("old", "x", deleting=True)]) == ("wait", ["old"])
    assert model.deployment_step(d, [pod("new", h)]) == ("none", [])
    assert model.deployment_step(d, [pod("a", h), pod("b", h)]) == ("delete-old", ["b"])
    assert model.deployment_step(deployment(replicas=0), [pod("a", h)]) == ("delete-old", ["a"])
    assert model.template_hash(deployment("b")["spec"]["template"]) != h


def test_the_pod_is_owned_by_its_deployment_and_admitted_with_a_service_account_token() -> None:
    p = model.pod_for(deployment(), "abcde", "xyz12")
    h = model.template_hash(deployment()["spec"]["template"])
    assert p["metadata"]["name"] == f"d-{h}-abcde"
    assert p["metadata"]["labels"] == {"app": "d", model.TEMPLATE_HASH_LABEL: h}
    assert p["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert p["metadata"]["finalizers"] == [model.GRACEFUL_FINALIZER]
    spec = p["spec"]
    assert spec["serviceAccountName"] == "default"
    vol = spec["volumes"][-1]
    assert vol["name"] == "kube-api-access-xyz12"
    assert [next(iter(s)) for s in vol["projected"]["sources"]] == [
        "serviceAccountToken",
        "configMap",
        "downwardAPI",
    ]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "kube-api-access-xyz12", "readOnly": True, "mountPath": model.SERVICE_ACCOUNT_DIR}
    ]
    no = model.admit_service_account(
        {"automountServiceAccountToken": False, "containers": [{"name": "c"}]}, "s"
    )
    assert "volumes" not in no


def test_sysctls_safe_allowed_or_forbidden() -> None:
    spec = {
        "securityContext": {
            "sysctls": [
                {"name": "net.ipv4.ip_forward", "value": "1"},
                {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                {"name": "net.ipv4.conf.all.rp_filter", "value": "2"},
            ]
        }
    }
    assert model.forbidden_sysctls(spec, ()) == ["net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter"]
    assert model.forbidden_sysctls(spec, ("net.ipv4.ip_forward",)) == ["net.ipv4.conf.all.rp_filter"]
    assert model.forbidden_sysctls(spec, ("net.ipv4.*",)) == []


@pytest.mark.parametrize(
    ("annotation", "want"),
    [
        ('[{"name":"a","namespace":"x"}]', [("x", "a", "net1")]),
        ('[{"name":"a"},{"name":"b","interface":"ens7"}]', [("p", "a", "net1"), ("p", "b", "ens7")]),
        ("x/a@eth9, b", [("x", "a", "eth9"), ("p", "b", "net2")]),
        ("", []),
    ],
)
def test_multus_selections_and_their_interface_names(
    annotation: str, want: list[tuple[str, str, str]]
) -> None:
    assert model.network_selections(annotation, "p") == want


def test_host_device_configurations() -> None:
    assert model.host_device('{"type": "host-device", "hwaddr": "FA:16:3E:00:00:01"}') == (
        "fa:16:3e:00:00:01",
        None,
    )
    assert model.host_device('{"plugins": [{"type": "host-device", "device": "ens7"}]}') == (None, "ens7")
    with pytest.raises(ValueError, match="macvlan"):
        model.host_device('{"type": "macvlan", "master": "eth0"}')


def test_environment_in_the_kubelets_order_with_expansion() -> None:
    p = {"metadata": {"name": "pn", "namespace": "ns", "labels": {"a": "1"}}, "status": {"podIP": "10.0.0.5"}}
    c = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-$(CM_k)-$(NOPE)-$$(A)"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "O", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}}},
        ],
    }
    lookup = {("configmap", "cm"): {"k": "v"}, ("secret", "s"): {"k": "sv"}, ("secret", "gone"): None}
    env = model.container_env(c, p, lookup, {"BASE": "b"})
    assert env == {
        "BASE": "b",
        "CM_k": "v",
        "A": "x",
        "B": "x-v-$(NOPE)-$(A)",
        "IP": "10.0.0.5",
        "L": "1",
        "S": "sv",
    }
    with pytest.raises(model.EnvError, match="secret 'gone'"):
        model.container_env(
            {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]},
            p,
            lookup,
            {},
        )
    assert model.service_env("10.96.0.1", 443)["KUBERNETES_PORT_443_TCP"] == "tcp://10.96.0.1:443"


def test_command_replaces_entrypoint_and_args_replace_cmd() -> None:
    assert model.command_line({"command": ["a"], "args": ["b"]}, {}, ["E"], ["C"]) == ["a", "b"]
    assert model.command_line({"command": ["a"]}, {}, ["E"], ["C"]) == ["a"]
    assert model.command_line({"args": ["b"]}, {}, ["E"], ["C"]) == ["E", "b"]
    assert model.command_line({}, {}, ["E"], ["C"]) == ["E", "C"]


def test_volume_files_with_items_and_modes() -> None:
    cm = {"data": {"a": "1", "b": "2"}, "binaryData": {"bin": "AAE="}}
    assert model.configmap_files(cm, {}) == {
        "a": (b"1", 0o644),
        "b": (b"2", 0o644),
        "bin": (b"\x00\x01", 0o644),
    }
    assert model.configmap_files(
        cm, {"items": [{"key": "a", "path": "x/y", "mode": 0o400}], "defaultMode": 0o600}
    ) == {"x/y": (b"1", 0o400)}
    assert model.secret_files({"data": {"k": "dg=="}}, {"defaultMode": 0o440}) == {"k": (b"v", 0o440)}
    assert quantity_bytes("16Mi") == 16 * 1024 * 1024 and quantity_bytes("1G") == 10**9


def test_restarts_at_once_then_double_up_to_the_cap() -> None:
    assert [model.restart_delay(n) for n in range(1, 8)] == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]


def test_probe_thresholds() -> None:
    probe = {"failureThreshold": 2, "successThreshold": 1}
    s = model.ProbeState()
    s = model.probe_step(s, False, probe)
    assert s.ok is None
    s = model.probe_step(s, False, probe)
    assert s.ok is False
    assert model.probe_step(s, True, probe).ok is True


def test_pod_status_conditions_and_transition_times() -> None:
    running = model.ContainerState("c", "img", state="running", ready=True, started=True, started_at="t")
    init = model.ContainerState("i", "img", state="terminated", exit_code=0, reason="Completed")
    view = model.PodView(
        phase="Running", pod_ip="10.0.0.2", sandbox_ready=True, init=(init,), containers=(running,)
    )
    status, kept = model.pod_status(view, "T1")
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
        "PodScheduled": "True",
    }
    again, _ = model.pod_status(model.PodView(**{**view.__dict__, "transitions": kept}), "T2")
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"T1"}, "kept while it holds"
    crashed = model.ContainerState("c", "img", state="waiting", reason="CrashLoopBackOff", restarts=2)
    st, _ = model.pod_status(model.PodView(phase="Running", containers=(crashed,), transitions=kept), "T3")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["lastTransitionTime"], ready["reason"]) == (
        "False",
        "T3",
        "ContainersNotReady",
    )
    assert st["containerStatuses"][0]["restartCount"] == 2


def test_the_lab_strongswan_conf_differs_from_the_images_only_by_kernel_libipsec() -> None:
    image = adapt.IMAGE_STRONGSWAN_CONF.read_text()
    lab = adapt.lab_strongswan_conf(image)
    assert lab.replace("kernel-libipsec kernel-netlink", "kernel-netlink", 1) == image
    charon_load = next(
        line for line in lab.splitlines() if line.strip().startswith("load =") and "vici" in line
    )
    assert "kernel-libipsec kernel-netlink" in charon_load
    with pytest.raises(ValueError):
        adapt.lab_strongswan_conf("charon {\n  load = random\n}\n")


def query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return struct.pack("!6H", 0x1234, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!2H", qtype, 1)


def test_dns_answers_known_names_and_nxdomain_for_the_rest() -> None:
    answer = dns_answer(query("db.fabric.example"), {"db.fabric.example": "192.0.2.67"})
    assert answer is not None
    ident, flags, _, ancount, _, _ = struct.unpack("!6H", answer[:12])
    assert (ident, flags & 0xF, ancount) == (0x1234, 0, 1) and answer.endswith(bytes([192, 0, 2, 67]))
    nx = dns_answer(query("db.fabric.example.ns.svc.cluster.local"), {"db.fabric.example": "192.0.2.67"})
    assert nx is not None and struct.unpack("!6H", nx[:12])[1] & 0xF == 3
    aaaa = dns_answer(query("db.fabric.example", 28), {"db.fabric.example": "192.0.2.67"})
    assert aaaa is not None and struct.unpack("!6H", aaaa[:12])[3] == 0, "no AAAA: an empty answer"
    assert dns_answer(b"short", {}) is None


POLICY = {
    "spec": {
        "policyTypes": ["Ingress", "Egress"],
        "egress": [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
            {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        ],
    }
}
PODS = {
    "10.96.0.10": netpol.PodIdentity({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
}


def test_network_policy_egress_rules_decide_and_a_policy_is_derived_from_what_was_seen() -> None:
    assert netpol.allowed(POLICY, "UDP", "10.96.0.10", 53, PODS) == [0]
    assert netpol.allowed(POLICY, "TCP", "10.96.0.1", 443, PODS) == [1]
    assert netpol.allowed(POLICY, "UDP", "198.51.100.2", 51820, PODS) == []
    assert netpol.allowed(POLICY, "TCP", "10.96.0.2", 443, PODS) == []
    derived = netpol.derive([("TCP", "10.96.0.1", 443), ("UDP", "10.96.0.10", 53)], PODS)
    assert derived == [
        {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}],
        },
    ]
    assert json.dumps(derived)


def test_the_capture_tells_the_pods_own_connections_from_answers_to_others() -> None:
    t = capture.Tracker()
    syn = capture.Packet("TCP", "10.244.1.2", "10.96.0.1", 40000, 443, syn=True)
    reply = capture.Packet("TCP", "10.96.0.1", "10.244.1.2", 443, 40000, syn=True, ack=True)
    probe = capture.Packet("TCP", "10.244.1.1", "10.244.1.2", 50000, 8081, syn=True)
    answer = capture.Packet("TCP", "10.244.1.2", "10.244.1.1", 8081, 50000, syn=True, ack=True)
    for pkt, from_pod in ((syn, True), (reply, False), (probe, False), (answer, True)):
        t.feed(pkt, from_pod, 0.0)
    assert set(t.flows) == {
        capture.Flow("egress", "TCP", "10.96.0.1", 443),
        capture.Flow("ingress", "TCP", "10.244.1.1", 8081),
    }
