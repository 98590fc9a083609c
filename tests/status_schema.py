"""Nothing any writer puts in a gateway's status is pruned by its structural status schema.

The API server drops every status field the CRD does not declare (and every null of a non-nullable one),
silently. So each writer's full status, built with the writer's OWN code, is written the way that writer
writes it (merge patches of the status subresource, in turn, as they happen in a cluster) and the status
read back must be exactly the merge of what was written:

* the controller (``controller.reconcile.outcome``: every condition it can set, ``OwnedObjects`` included,
  observedGeneration, nodeName, publicIP, ha), through ``controller.execute``'s status write;
* the IPsec status-agent (``agent.ipsec.keeper.Keeper.status_document`` over ``tunnels_status`` of a
  list-sas snapshot: an Established tunnel with counters and a rekeying child, a Failed one with nulls),
  and the WireGuard one (``WireGuardAgent._publish``: Connected, NeverConnected and Failed peers), each with
  ``initNat`` (``agent.sink.WithInitNat`` over an init-nat status file) and through ``KubeStatusApi``;
* then the healthy agent status after the failing one (its nulls delete keys: a merge patch);
* and each VPNPeer's own status (``agent.peerstatus.peer_statuses`` of those same agent statuses, as
  ``agent.sink.WithPeerStatus`` derives it), written to a VPNPeer of that name, failing then healthy.

``round_trips`` runs against the API emulator (tests/component/test_status_schema.py) and the real
kube-apiserver (tests/integration/test_status_schema_real.py): a field missing from the schema fails both.
"""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from agent.fakes import ListSink, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper
from agent.ipsec.status import tunnels_status
from agent.peerstatus import peer_statuses
from agent.runtime import Secrets
from agent.sink import KubeStatusApi, WithInitNat
from agent.wireguard.run import WireGuardAgent
from controller import execute
from controller.names import key_of
from controller.reconcile import Report, outcome
from controller.status import Condition, WriteFailure
from gwkit.kube.client import IPSECGATEWAYS, NAMESPACES, VPNGATEWAYS, VPNPEERS, KubeClient, Resource
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import Conflict
from gwkit.wireguard.model import DeviceState, PeerState
from gwplan import Child, GatewayRef, Ipsec, Plan, Tunnel, WgPeer
from tests.examples import example_docs
from tests.helpers import create_when_served
from tests.kube_contract import _with_crds

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
KEY_A = "ndMB0U9Tj4E4/5wKf/gWNO7jDafzWOAObYzbYEYkUiw="
KEY_B = "+/" * 21 + "A="
KEY_C = "a" * 42 + "E="


def merge(target: Any, patch: Any) -> Any:
    """A JSON merge patch as kube-apiserver applies it (evanphx/json-patch ``MergePatch``): RFC 7386, and
    a value that replaces (a list, a new key) is stored without the nulls of the objects in it: a tunnel's
    ``"establishedAt": null`` in a written list is stored absent (measured against the real server)."""
    if not isinstance(patch, Mapping):
        return _without_nulls(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return copy.deepcopy(value)


def controller_status(generation: int) -> dict[str, Any]:
    """The controller's status patch with every condition it sets (``outcome``, as the reconcile)."""
    report = Report(
        parts=(
            Condition(
                "ConfigRendered", False, "PartlyRendered", "peer b: spec.ipsec.pskSecretRef: not found"
            ),
            Condition("CloudReady", True, "Attached", "port p, floating IP 203.0.113.10"),
            Condition("RoutingReady", True, "Routed", "router r routes 10.1.0.0/16"),
            Condition("SecurityGroupScoped", False, "PeerByHostname", "UDP 500/4500 open to 0.0.0.0/0"),
            Condition("PodReady", True, "Running", "pod gw-0 on node n1"),
            Condition("DeployedPlan", True, "Deployed", "plan sha256:ab"),
            Condition("StandbyReady", True, "StandbyReady", "pod gw-b-0 (slot b) stands by on node n2"),
        ),
        foreign=("ConfigMap/gateways/ipsecgw-gw",),
        seen={},
        generation=generation,
        node="n1",
        public_ip="203.0.113.10",
        now="2026-12-01T10:00:00Z",
        ha={
            "activeSlot": "a",
            "activePod": "gw-0",
            "activeNode": "n1",
            "standbyPod": "gw-b-0",
            "standbyNode": "n2",
            "lastFailoverTime": "2026-12-01T09:00:00Z",
            "lastFailoverReason": "LeaseExpired",
        },
    )
    failure = WriteFailure("Secret", "gateways/x", "create", 403, "Forbidden", "secrets is forbidden")
    patch, _ = outcome(report, [failure])
    assert patch is not None
    return patch


def _ike(name: str, uid: int, *children: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": "ESTABLISHED",
        "established": "60",
        "rekey-time": "3000",
        "child-sas": {f"{c['name']}-{c['uniqueid']}": c for c in children},
    }


def _child(name: str, uid: int) -> dict[str, Any]:
    return {
        "name": name,
        "uniqueid": str(uid),
        "state": "INSTALLED",
        "bytes-in": "123456789012",
        "bytes-out": "42",
        "packets-in": "1000",
        "packets-out": "7",
        "rekey-time": "100",
        "install-time": "10",
    }


def ipsec_plan(kind: str, api_version: str, namespace: str, name: str) -> Plan:
    def tunnel(t: str, *subnets: str) -> Tunnel:
        children = tuple(Child(f"{t}-{i}", s) for i, s in enumerate(subnets))
        conn = {t: {"version": "2", "children": {c.name: {} for c in children}}}
        return Tunnel(t, True, children, conn)

    return Plan(
        gateway=GatewayRef(kind, api_version, namespace, name),
        type="ipsec",
        ipsec=Ipsec(
            secrets=(), tunnels=(tunnel("hq", "10.1.0.0/24", "10.2.0.0/24"), tunnel("branch", "10.3.0.0/24"))
        ),
    )


def ipsec_agent_status(plan: Plan, *, failing: bool) -> dict[str, Any]:
    """``Keeper.status_document`` (what the IPsec keeper publishes) for an up and a failed tunnel."""
    keeper = Keeper(
        Path("/nonexistent/charon.vici"),
        StaticPlans(plan),
        cast(Secrets, None),
        ListSink(),
        HealthState(stale_after=60),
    )
    assert plan.ipsec is not None
    sas = {"1": _ike("hq", 1, _child("hq-0", 2), _child("hq-1", 3))}
    errors = {"branch": "AUTHENTICATION_FAILED: the peer rejected our authentication"} if failing else {}
    if not failing:
        sas["4"] = _ike("branch", 4, _child("branch-0", 5))
    keeper.plan = plan
    keeper.daemon = "charon 5.9.8"
    keeper.statuses, _ = tunnels_status(plan.ipsec.tunnels, sas, now=NOW, errors=errors)
    if failing:
        keeper.plan_error = "plan rejected: tunnel x: no such secret"
    doc = keeper.status_document()
    assert [t["state"] for t in doc["tunnels"]] == (
        ["Established", "Failed"] if failing else ["Established"] * 2
    )
    return doc


async def wireguard_agent_status(*, failing: bool) -> dict[str, Any]:
    """What ``WireGuardAgent._publish`` publishes: Connected, NeverConnected and (failing) Failed peers."""
    now = NOW.timestamp()
    peers = (
        WgPeer("site-a", KEY_A, ("10.99.0.2/32", "203.0.113.0/28"), "198.51.100.2:51820"),
        WgPeer("laptop-b", KEY_B, ("10.99.0.3/32",)),
        WgPeer("laptop-c", KEY_C, ("10.99.0.4/32",)),
    )
    state = DeviceState(
        peers=(PeerState(KEY_A, "198.51.100.2:51820", ("10.99.0.2/32",), now - 10, 123456789012, 2000),)
    )
    agent = object.__new__(WireGuardAgent)  # only its status half: the device loop is not needed here
    sink = ListSink()
    vars(agent).update(
        state=state,
        clock=lambda: now,
        monotonic=lambda: 100.0,
        available=True,
        config_error="peer laptop-c: bad key" if failing else None,
        _apply_error=None,
        _lost_reported=None,
        good_plan="sha256:cd",
        _published=None,
        _published_sig=None,
        _published_at=0.0,
        settings=SimpleNamespace(resync_seconds=30.0),
        sink=sink,
        role="active",
        plan=None,
    )
    left_out = {"laptop-c": "Secret wg-c key psk: not found"} if failing else {}
    await agent._publish(cast(Any, SimpleNamespace(peers=peers)), left_out)
    (doc,) = sink.published
    return doc


INIT_NAT_FILE = {
    "version": "initnat-status/v1",
    "planHash": "sha256:ab",
    "leftOut": [
        {"exposure": "db", "field": "exposures", "virtualIp": "198.18.0.5", "reason": "host does not resolve",
         "grants": [], "host": "db.example.internal"},
        {"exposure": "printer", "field": "reverseExposures", "virtualIp": "198.18.0.6",
         "reason": "virtual IP claimed twice", "grants": [], "kind": "reverse"},
    ],
    "keptTargets": [],
    "lastError": "iptables-restore: exit 1",
    "ipv6": {"state": "unguarded", "reason": "ip6tables: not found"},
}  # fmt: skip


async def with_init_nat(status: Mapping[str, Any], init_nat: Mapping[str, Any] | None) -> dict[str, Any]:
    """``status`` as ``WithInitNat`` publishes it, init-nat's status file holding ``init_nat``."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "initnat.json"
        if init_nat is not None:
            path.write_text(json.dumps(init_nat))
        sink = ListSink()
        await WithInitNat(sink, path).publish(status)
    (doc,) = sink.published
    return doc


async def round_trips(kubeconfig: Path, namespace: str) -> dict[str, dict[str, Any]]:
    """Every writer's status written to a VPNGateway (IPsec and WireGuard) and an IPsecGateway, read back
    unchanged after each write. Returns the last status of each (by gateway name) for the caller to show."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        with contextlib.suppress(Conflict):
            await kube.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        await _with_crds(kube)
        ipsec_gw = example_docs("ipsec.yaml")[0]
        wg_gw = example_docs("wireguard.yaml")[0]
        legacy_gw = example_docs("legacy-ipsecgateway.yaml")[0]
        out: dict[str, dict[str, Any]] = {}
        for res, doc in ((VPNGATEWAYS, ipsec_gw), (VPNGATEWAYS, wg_gw), (IPSECGATEWAYS, legacy_gw)):
            created = await create_when_served(kube, res, doc, namespace)
            name = created["metadata"]["name"]
            ref = GatewayRef(created["kind"], created["apiVersion"], namespace, name)
            agent_api = KubeStatusApi(kube)
            expected: dict[str, Any] = {}

            async def check(
                what: str, patch: Mapping[str, Any], res: Resource = res, name: str = name
            ) -> None:
                nonlocal expected
                expected = merge(expected, patch)
                got = (await kube.get(res, name, namespace)).get("status") or {}
                assert got == expected, (
                    f"{res.kind} {name}: the status read back after the {what} write differs from what was "
                    f"written (pruned by the schema?):\nwrote {json.dumps(patch, indent=1, sort_keys=True)}"
                    f"\nread {json.dumps(got, indent=1, sort_keys=True)}"
                )

            ctl = controller_status(int(created["metadata"].get("generation") or 1))
            await execute._write_status(kube, key_of(created), created.get("status") or {}, "", ctl)
            await check("controller", ctl)
            if doc is wg_gw:
                statuses = [await wireguard_agent_status(failing=f) for f in (True, False)]
            else:
                plan = ipsec_plan(ref.kind, ref.api_version, namespace, name)
                statuses = [ipsec_agent_status(plan, failing=f) for f in (True, False)]
            for failing, status in zip((True, False), statuses, strict=True):
                doc_ = await with_init_nat(status, INIT_NAT_FILE if failing else None)
                await agent_api.patch_status(ref, doc_)
                await check("status-agent's " + ("failing" if failing else "healthy"), doc_)
            out[name] = expected
            if doc is not legacy_gw:
                peer_doc = next(d for d in example_docs("wireguard.yaml" if doc is wg_gw else "ipsec.yaml")
                                if d["kind"] == "VPNPeer" and d["spec"]["type"] == "site")  # fmt: skip
                out.update(await _peer_round_trips(kube, namespace, ref, peer_doc, statuses))
        return out


async def _peer_round_trips(
    kube: KubeClient,
    namespace: str,
    gateway: GatewayRef,
    peer_doc: Mapping[str, Any],
    statuses: list[dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Each peer of ``statuses`` (the agent's failing, then healthy, gateway status) as a VPNPeer of its
    gateway, its derived status written and read back after each write."""
    api = KubeStatusApi(kube)
    expected: dict[str, dict[str, Any]] = {}
    previous: dict[str, dict[str, Any]] = {}
    for when, status in zip(("2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"), statuses, strict=True):
        for peer, doc in peer_statuses(status, previous=previous, now=when).items():
            if peer not in expected:
                body = copy.deepcopy(dict(peer_doc))
                body["metadata"] = {"name": peer}
                body["spec"]["gatewayRef"] = {"name": gateway.name}
                await create_when_served(kube, VPNPEERS, body, namespace)
            await api.patch_status(GatewayRef("VPNPeer", gateway.api_version, namespace, peer), doc)
            expected[peer] = merge(expected.get(peer, {}), doc)
            got = (await kube.get(VPNPEERS, peer, namespace)).get("status") or {}
            assert got == expected[peer], (
                f"VPNPeer {peer}: the status read back differs from what was written (pruned by the schema?)"
                f":\nwrote {json.dumps(doc, indent=1, sort_keys=True)}"
                f"\nread {json.dumps(got, indent=1, sort_keys=True)}"
            )
            previous[peer] = doc
    assert {e["state"] for e in expected.values()} >= {"Established"}
    return {f"VPNPeer/{k}": v for k, v in expected.items()}
