"""One reconcile of one gateway, as pure decisions over a snapshot of what the API and the cloud hold now.

Level-triggered: ``render_gateway`` and ``decide`` see the whole world of one gateway (its CR, its peers,
its owned objects, its pod, the nodes) and return the whole answer (the writes, the status, the Events),
never a reaction to an event. The same snapshot gives the same answer, however many events were missed,
and a world already in order gives no write at all. The I/O around them is ``controller.run``.

Order inside one reconcile (the shell's)::

    snapshot (caches) -> render_gateway -> place -> cloud.ensure (I/O) -> decide -> execute (I/O)

An invalid CR never replaces a working plan: the plan in force stays the deployed one (its virtual IPs,
marks and Secret references), ``ConfigRendered`` goes False naming every field error, and an Event says so
once (on the transition).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gwplan
from controller import diff, placement, status
from controller.api.model import IPsecGateway, VPNGateway, VPNPeer, parse
from controller.api.validate import InvalidInput, Problem, admit
from controller.cloud import CLOUD_READY, CloudState
from controller.desired import Desired, Inputs, desired, plan_of
from controller.names import FINALIZER, GatewayKey, selector_labels
from controller.plan.render import RenderOptions, render, with_nic
from controller.settings import Settings
from controller.status import Condition, StatusEvent

Obj = dict[str, Any]
CONFIG_RENDERED, POD_READY = "ConfigRendered", "PodReady"


@dataclass(frozen=True)
class Snapshot:
    key: GatewayKey
    gateway: Mapping[str, Any]
    peers: tuple[Mapping[str, Any], ...] = ()
    """The VPNPeers of the gateway's namespace whose gatewayRef names it (VPNGateway only)."""
    owned: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """kind -> the object of the gateway's object name of that kind, as the API holds it."""
    pods: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[Mapping[str, Any], ...] = ()
    pinned: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Gateways pinned to each node, this one excluded."""

    @property
    def uid(self) -> str:
        return str(self.gateway["metadata"]["uid"])

    @property
    def generation(self) -> int:
        return int(self.gateway["metadata"].get("generation") or 0)

    @property
    def current_status(self) -> Mapping[str, Any]:
        return self.gateway.get("status") or {}

    @property
    def deleting(self) -> bool:
        return bool(self.gateway["metadata"].get("deletionTimestamp"))

    @property
    def has_finalizer(self) -> bool:
        return FINALIZER in (self.gateway["metadata"].get("finalizers") or [])

    @property
    def current_node(self) -> str | None:
        """Where the gateway runs now: the Deployment's pin, else the status's."""
        dep = self.owned.get("Deployment")
        if dep is not None:
            node = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeName")
            if node:
                return str(node)
        node = self.current_status.get("nodeName")
        return str(node) if node else None


@dataclass(frozen=True)
class Rendered:
    plan: gwplan.Plan | None
    """The plan just rendered (its ``nic`` still empty), None when the input is invalid."""
    previous: gwplan.Plan | None
    """The deployed plan (from the owned ConfigMap)."""
    problems: tuple[Problem, ...] = ()
    previous_error: str | None = None

    @property
    def in_force(self) -> gwplan.Plan | None:
        return self.plan if self.plan is not None else self.previous


def render_gateway(snap: Snapshot, settings: Settings) -> Rendered:
    previous: gwplan.Plan | None = None
    previous_error = None
    cm = snap.owned.get("ConfigMap")
    if cm is not None:
        try:
            previous = plan_of(cm)
        except gwplan.PlanError as exc:
            previous_error = f"the deployed plan in ConfigMap {snap.key.object_name} is unreadable: {exc}"
    docs = [_as_stored(snap.gateway), *(_as_stored(p) for p in snap.peers)]
    problems: list[Problem] = []
    stored: list[Any] = []
    for doc in docs:
        found, doc_stored = admit(doc)
        problems += found
        stored.append(doc_stored)
    if problems:
        return Rendered(None, previous, tuple(problems), previous_error)
    gateway = parse(stored[0])
    peers = [p for p in (parse(d) for d in stored[1:]) if isinstance(p, VPNPeer)]
    assert isinstance(gateway, VPNGateway | IPsecGateway)
    options = RenderOptions(
        internal_source_cidrs=settings.internal_source_cidrs,
        previous=previous,
        nic=gwplan.Nic(),
        wireguard_interface=settings.wireguard_interface,
    )
    try:
        plan = render(gateway, peers, options)
    except InvalidInput as exc:
        return Rendered(None, previous, exc.problems, previous_error)
    return Rendered(plan, previous, (), previous_error)


def _as_stored(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The fields validation reads (the API's own metadata and the status are not the user's input)."""
    md = doc.get("metadata") or {}
    return {
        "apiVersion": doc.get("apiVersion"),
        "kind": doc.get("kind"),
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": doc.get("spec"),
    }


def place(snap: Snapshot, settings: Settings) -> placement.Placement:
    return placement.place(
        snap.current_node,
        snap.nodes,
        snap.pinned,
        selector=settings.pod.node_selector,
        tolerations=settings.pod.tolerations,
        cap=settings.pod.max_gateways_per_node,
    )


def provider_id(snap: Snapshot, node: str | None) -> str | None:
    for n in snap.nodes:
        if (n.get("metadata") or {}).get("name") == node:
            pid = (n.get("spec") or {}).get("providerID")
            return str(pid) if pid else None
    return None


@dataclass(frozen=True)
class Decision:
    actions: tuple[diff.Action, ...]
    foreign: tuple[diff.Foreign, ...]
    status: Obj | None
    """The merge patch of the controller's status keys; None: already so."""
    events: tuple[StatusEvent, ...]
    add_finalizer: bool
    desired: Desired | None


def config_condition(rendered: Rendered) -> Condition:
    if rendered.problems:
        kept = " (the deployed plan keeps running)" if rendered.previous is not None else ""
        msg = "; ".join(str(p) for p in rendered.problems)
        return Condition(CONFIG_RENDERED, False, rendered.problems[0].reason or "Invalid", msg + kept)
    assert rendered.plan is not None
    p = rendered.plan
    what = (
        f"{len(p.ipsec.tunnels)} tunnel(s)"
        if p.ipsec is not None
        else f"{len(p.wireguard.peers) if p.wireguard else 0} WireGuard peer(s)"
    )
    return Condition(
        CONFIG_RENDERED,
        True,
        "Rendered",
        f"plan {gwplan.plan_hash(p)[:19]}: {what}, {len(p.nat.grants)} grant(s)",
    )


def pod_condition(snap: Snapshot, node: str | None, nic: bool, where: placement.Placement) -> Condition:
    if not nic:
        return Condition(POD_READY, False, "NoNIC2", "waiting for the cloud to provide NIC2")
    if node is None:
        return Condition(POD_READY, False, where.reason, where.message)
    pods = [
        p
        for p in snap.pods
        if not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("spec") or {}).get("nodeName") == node
    ]
    if not pods:
        return Condition(POD_READY, False, "NoPod", f"no gateway pod on node {node} yet")
    pod = sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", "")))[-1]
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return Condition(POD_READY, True, "PodReady", f"pod {pod['metadata']['name']} is ready on {node}")
    waiting = [
        f"{cs.get('name')}: {(cs.get('state') or {}).get('waiting', {}).get('reason')}"
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
        if (cs.get("state") or {}).get("waiting")
    ]
    phase = st.get("phase") or "Pending"
    detail = f" ({', '.join(waiting)})" if waiting else ""
    return Condition(POD_READY, False, "PodNotReady", f"pod {pod['metadata']['name']} is {phase}{detail}")


def decide(
    snap: Snapshot,
    settings: Settings,
    rendered: Rendered,
    where: placement.Placement,
    cloud: CloudState,
    now: str,
) -> Decision:
    plan = rendered.in_force
    plan_desired: Desired | None = None
    actions: list[diff.Action] = []
    foreign: list[diff.Foreign] = []
    if plan is not None:
        if cloud.nic is not None:
            nic = dataclasses.replace(
                plan.nic, mac=cloud.nic.mac, address=cloud.nic.address, gateway=cloud.nic.gateway
            )
            plan = with_nic(plan, nic)
        inputs = Inputs(snap.key, snap.uid, plan, settings, cloud.nic, where.node)
        plan_desired = desired(inputs)
        if cloud.nic is None:
            # Without NIC2 nothing can run: keep what exists (a running pod keeps its plan) and add only
            # what does not depend on it.
            kept = {"ConfigMap", "NetworkAttachmentDefinition", "Deployment"}
            plan_desired = Desired(
                tuple(o for o in plan_desired.objects if o["kind"] not in kept), plan_desired.held | kept
            )
        acts, foreign = diff.plan_actions(plan_desired.objects, snap.owned, snap.uid)
        actions = list(acts)
    parts = [config_condition(rendered), *cloud.conditions]
    if not any(c.type == CLOUD_READY for c in cloud.conditions):
        parts.append(Condition(CLOUD_READY, True, "Ready", "the cloud holds what the gateway needs"))
    parts.append(pod_condition(snap, where.node, cloud.nic is not None, where))
    if foreign:
        names = ", ".join(f"{f.kind}/{f.name}" for f in foreign)
        parts.append(
            Condition(
                "OwnedObjects", False, "ObjectNameTaken", f"{names} exist and do not belong to this gateway"
            )
        )
    if rendered.previous_error and rendered.plan is None:
        parts.append(Condition("DeployedPlan", False, "PreviousPlanInvalid", rendered.previous_error))
    before = list(snap.current_status.get("conditions") or [])
    conds = status.conditions(parts, before, snap.generation, now)
    wanted: Obj = {
        "conditions": conds,
        "observedGeneration": snap.generation,
        "nodeName": where.node if where.node is not None else snap.current_node,
        "publicIP": cloud.public_ip,
    }
    patch = status.status_patch(snap.current_status, wanted)
    evts = status.events(before, conds)
    if where.moved_from is not None and where.node is not None:
        evts.append(StatusEvent("Normal", "Repinned", where.message))
    return Decision(
        tuple(actions),
        tuple(foreign),
        patch,
        tuple(evts),
        not snap.has_finalizer and not snap.deleting,
        plan_desired,
    )


def pod_selector(key: GatewayKey) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(key).items()))


def peers_of(key: GatewayKey, peers: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """The VPNPeers naming ``key``'s gateway (peers only belong to VPNGateways), sorted by name."""
    if key.kind != "VPNGateway":
        return ()
    mine = [
        p
        for p in peers
        if (p.get("metadata") or {}).get("namespace") == key.namespace
        and ((p.get("spec") or {}).get("gatewayRef") or {}).get("name") == key.name
    ]
    return tuple(sorted(mine, key=lambda p: str(p["metadata"]["name"])))
