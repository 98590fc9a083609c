"""NetworkPolicy egress, evaluated against what a pod was seen sending (pure).

The lab has no NetworkPolicy implementation; the e2e tests record the pod's eth0 egress (capture.py) and
check it against the gateway's NetworkPolicy with these rules, which are the API's: a connection is
allowed when some egress rule matches both its port (protocol defaults to TCP; no ports: any) and its
destination (no ``to``: anywhere; ``ipBlock`` by CIDR minus ``except``; a namespace/pod selector: the
destination is a pod those select). The lab's cluster services stand for pods: the DNS address for the
kube-dns pods in kube-system (``LAB_PODS``).

``derive`` goes the other way: the smallest egress rules that allow exactly what was seen, so a test can
say that the controller's policy allows what the pod needs and nothing it never used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class PodIdentity:
    namespace_labels: Mapping[str, str]
    labels: Mapping[str, str]


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], ip: str, pods: Mapping[str, PodIdentity]) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        addr = IPv4Address(ip)
        if addr not in IPv4Network(block["cidr"]):
            return False
        return not any(addr in IPv4Network(x) for x in block.get("except") or [])
    pod = pods.get(ip)
    if pod is None:
        return False
    ns_sel = peer.get("namespaceSelector")
    if ns_sel is None and "podSelector" in peer:
        return False  # a podSelector alone selects pods in the policy's own namespace: none of the lab's
    return _selects(ns_sel, pod.namespace_labels) and _selects(peer.get("podSelector"), pod.labels)


def _port_matches(rule_ports: Sequence[Mapping[str, Any]] | None, protocol: str, port: int | None) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        if str(p.get("protocol", "TCP")) != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        end = p.get("endPort")
        if port is not None and (port == int(want) or (end is not None and int(want) <= port <= int(end))):
            return True
    return False


def allowed(
    policy: Mapping[str, Any], protocol: str, ip: str, port: int | None, pods: Mapping[str, PodIdentity]
) -> list[int]:
    """Indexes of the policy's egress rules that allow this connection (empty: denied)."""
    spec = policy.get("spec") or {}
    if "Egress" not in (spec.get("policyTypes") or []):
        return [-1]
    out = []
    for i, rule in enumerate(spec.get("egress") or []):
        if not _port_matches(rule.get("ports"), protocol, port):
            continue
        to = rule.get("to")
        if not to or any(_peer_matches(peer, ip, pods) for peer in to):
            out.append(i)
    return out


def derive(flows: Iterable[tuple[str, str, int | None]], pods: Mapping[str, PodIdentity]) -> list[Obj]:
    """The smallest egress rules that allow exactly these (protocol, ip, port) connections: one rule per
    destination, a pod selector where the destination is a known pod, else a /32."""
    by_dest: dict[str, set[tuple[str, int | None]]] = {}
    for proto, ip, port in flows:
        by_dest.setdefault(ip, set()).add((proto, port))
    rules = []
    for ip, ports in sorted(by_dest.items()):
        pod = pods.get(ip)
        peer: Obj = (
            {
                "namespaceSelector": {"matchLabels": dict(pod.namespace_labels)},
                "podSelector": {"matchLabels": dict(pod.labels)},
            }
            if pod
            else {"ipBlock": {"cidr": f"{ip}/32"}}
        )
        rules.append({"to": [peer], "ports": [{"protocol": p, "port": n} for p, n in sorted(ports, key=str)]})
    return rules
