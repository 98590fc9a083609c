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
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gwplan
from controller import diff, ha, placement, status
from controller.api.model import IPsecGateway, VPNGateway, VPNPeer, parse
from controller.api.schema import FieldError, show
from controller.api.validate import InvalidInput, Item, Neighbour, Problem, admit
from controller.cloud import CLOUD_READY, CloudState
from controller.cloudplan import NO_ROUTER, ROUTING_READY
from controller.desired import (
    HA_SLOTS,
    HOME_SLOTS,
    SLOT_B,
    TENANT_SLOTS,
    Desired,
    HaInputs,
    Inputs,
    Nic2,
    desired,
    plan_of,
    too_large,
)
from controller.names import (
    ANNOTATION_HASH,
    FINALIZER,
    LABEL_OWNER_UID,
    LABEL_TENANT,
    TENANT_ENABLED,
    GatewayKey,
    owner_of,
    selector_labels,
)
from controller.plan.render import (
    Conn,
    PeerNow,
    RenderOptions,
    StillAsked,
    keep_only_still_asked,
    normalise,
    render_parts,
    with_nic,
)
from controller.settings import Settings
from controller.status import Condition, StatusEvent, WriteFailure

Obj = dict[str, Any]
CONFIG_RENDERED, POD_READY, DEPLOYED_PLAN = "ConfigRendered", "PodReady", "DeployedPlan"


@dataclass(frozen=True)
class Snapshot:
    key: GatewayKey
    gateway: Mapping[str, Any]
    peers: tuple[Mapping[str, Any], ...] = ()
    """The VPNPeers of the gateway's namespace whose gatewayRef names it (VPNGateway only)."""
    owned: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """slot -> the object of the gateway's name in that slot (``controller.desired``), as the API holds it."""
    leftovers: tuple[Mapping[str, Any], ...] = ()
    """What an earlier release made for this gateway in the tenant's namespace (``LEFTOVER_KINDS``)."""
    pods: tuple[Mapping[str, Any], ...] = ()
    """The gateway's pods, wherever they run (the gateway namespace; the tenant's before the move)."""
    namespace_enabled: bool = True
    """The gateway's namespace carries ``names.LABEL_TENANT`` (its gateways are served)."""
    secrets: frozenset[str] | None = None
    """The Secrets of the gateway's namespace whose owners opted them in (``names.LABEL_GATEWAY_SECRET``);
    None: no check (the offline tools)."""
    secrets_unreadable: str | None = None
    """Why the controller cannot tell which Secrets are opted in (nothing new is rendered then)."""
    nodes: tuple[Mapping[str, Any], ...] = ()
    pinned: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Gateways pinned to each node, this one excluded."""
    neighbours: tuple[Neighbour, ...] = ()
    """The other gateways whose serviceCIDRs come before this one's (``neighbours``)."""
    links: Links = dataclasses.field(default_factory=lambda: Links())
    """The ClusterLinks naming this gateway (``cluster_links``)."""

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
    """The plan just rendered (its ``nic`` still empty), None when the gateway itself is invalid."""
    previous: gwplan.Plan | None
    """The deployed plan (from the owned ConfigMap)."""
    problems: tuple[Problem, ...] = ()
    """Every problem: of the gateway (then ``plan`` is None), or of a part left out of ``plan``."""
    previous_error: str | None = None
    kept: gwplan.Plan | None = None
    """With no new plan: the deployed one without what was removed or revoked since."""

    @property
    def in_force(self) -> gwplan.Plan | None:
        return self.plan if self.plan is not None else self.kept


TRANSIT_UNKNOWN = "TransitNetworkUnknown"


def render_gateway(
    snap: Snapshot, settings: Settings, transit_cidrs: tuple[str, ...] | None = ()
) -> Rendered:
    """Fail closed per item: a schema-invalid peer, or a peer, exposure or grant that breaks a rule, is
    left out and named, the rest rendered. A gateway that is itself invalid renders nothing: the deployed
    plan stays, without what was removed or revoked since (``keep_only_still_asked``).

    ``transit_cidrs``: NIC2's networks, from the cloud (``Cloud.transit_cidrs``; None: unknown, and
    nothing new is rendered, as no serviceCIDR can be checked against them)."""
    previous: gwplan.Plan | None = None
    previous_error = None
    cm = snap.owned.get("ConfigMap")
    if cm is not None:
        try:
            previous = plan_of(cm)
        except gwplan.PlanError as exc:
            previous_error = f"the deployed plan in ConfigMap {snap.key.object_name} is unreadable: {exc}"
    refused, stored_gateway = admit(_as_stored(snap.gateway))
    left_out: list[Problem] = []
    peers: list[VPNPeer] = []
    for doc in snap.peers:
        found, stored = admit(_as_stored(doc))
        name = str((doc.get("metadata") or {}).get("name"))
        if found:
            left_out += [dataclasses.replace(p, item=Item("peer", name)) for p in found]
            continue
        peer = parse(stored)
        assert isinstance(peer, VPNPeer)
        peers.append(peer)

    def keep(problems: Sequence[Problem]) -> Rendered:
        kept = None
        if previous is not None:
            asked = still_asked(snap, {p.meta.name for p in peers})
            allowed = settings.allowance(snap.key.namespace).service_cidrs
            cidr = previous.nat.service_cidr
            if not snap.namespace_enabled or (cidr is not None and not within(cidr, allowed)):
                # Its namespace no longer enabled, or its serviceCIDR no longer allowed there: nothing of it
                # is served (no tunnel, no grant); the pod, NIC2 and the public address stay until that
                # changes back or the CR goes (found by review: a narrowed serviceCIDRs allowance did not
                # stop a refused gateway's tunnels).
                asked = dataclasses.replace(asked, peers={})
            # What the operator allows now holds for a kept plan too: narrowing an allowance must not
            # wait for a tenant to make its gateway valid again.
            asked = dataclasses.replace(
                asked,
                exposure_targets=settings.allowance(snap.key.namespace).exposure_targets,
                internal_source_cidrs=settings.internal_source_cidrs,
            )
            kept = keep_only_still_asked(previous, asked)
        return Rendered(None, previous, tuple(problems), previous_error, kept)

    if not snap.namespace_enabled:
        refused = [
            Problem(
                str(snap.key),
                FieldError(
                    "metadata.namespace",
                    f"is not enabled for gateways: the namespace needs the label "
                    f"{LABEL_TENANT}={TENANT_ENABLED} (set by whoever administers namespaces; "
                    "docs/install.md)",
                    show(snap.key.namespace),
                    "NamespaceNotEnabled",
                ),
            ),
            *refused,
        ]
    if snap.secrets_unreadable is not None:
        refused = [
            *refused,
            Problem(
                str(snap.key),
                FieldError(
                    "metadata.namespace",
                    snap.secrets_unreadable,
                    show(snap.key.namespace),
                    "SecretsUnreadable",
                ),
            ),
        ]
    if transit_cidrs is None:
        refused = [
            *refused,
            Problem(
                str(snap.key),
                FieldError(
                    "spec.serviceCIDR",
                    "cannot be checked against the gateways' transit network: the cloud cannot be asked "
                    "for it yet (retried; CloudReady says why)",
                    None,
                    TRANSIT_UNKNOWN,
                ),
            ),
        ]
    if refused:
        return keep([*refused, *left_out])
    gateway = parse(stored_gateway)
    assert isinstance(gateway, VPNGateway | IPsecGateway)
    allowance = settings.allowance(snap.key.namespace)
    options = RenderOptions(
        internal_source_cidrs=settings.internal_source_cidrs,
        previous=previous,
        nic=gwplan.Nic(),
        wireguard_interface=settings.wireguard_interface,
        transit_cidrs=transit_cidrs or (),
        neighbours=snap.neighbours,
        exposure_targets=allowance.exposure_targets,
        secrets=snap.secrets,
        service_cidrs=allowance.service_cidrs,
        api_server_cidrs=tuple(c for c, _ in settings.network_policy.api_server),
    )
    try:
        rendering = render_parts(gateway, peers, options)
    except InvalidInput as exc:
        return keep([*exc.problems, *left_out])
    why = too_large(rendering.plan)
    if why is not None:
        return keep([Problem(str(snap.key), FieldError("spec", why, None, "PlanTooLarge")), *left_out])
    return Rendered(rendering.plan, previous, (*left_out, *rendering.left_out), previous_error)


def still_asked(snap: Snapshot, valid_peers: set[str]) -> StillAsked:
    """What the raw objects still ask for, read defensively (the gateway may be schema-invalid)."""
    spec = snap.gateway.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}

    def names(key: str) -> frozenset[str]:
        items = spec.get(key)
        if not isinstance(items, list):
            return frozenset()
        return frozenset(
            i["name"] for i in items if isinstance(i, Mapping) and isinstance(i.get("name"), str)
        )

    def ref(value: Any) -> gwplan.SecretRef | None:
        if (
            isinstance(value, Mapping)
            and isinstance(value.get("name"), str)
            and isinstance(value.get("key"), str)
        ):
            return gwplan.SecretRef(value["name"], value["key"])
        return None

    def section(key: str) -> Mapping[str, Any]:
        value = spec.get(key)
        return value if isinstance(value, Mapping) else {}

    def conn(ike_id: Any, auth: Any, endpoint: Any, subnets: Any) -> Conn | None:
        """None when a field cannot be read for sure (the deployed connection then goes)."""
        if not isinstance(subnets, list) or not all(isinstance(x, str) for x in subnets):
            return None
        try:
            nets = frozenset(normalise(x) for x in subnets)
        except ValueError:
            return None
        return Conn(
            id=ike_id if isinstance(ike_id, str) else None,
            auth=auth if isinstance(auth, str) else None,
            endpoint=endpoint if isinstance(endpoint, str) else None,
            subnets=nets,
        )

    peers: dict[str, PeerNow] = {}
    if snap.key.kind == "IPsecGateway":
        psk = ref(section("auth").get("pskSecretRef"))
        tunnels = spec.get("tunnels")
        for t in tunnels if isinstance(tunnels, list) else []:
            if not isinstance(t, Mapping) or not isinstance(t.get("name"), str):
                continue
            peer = t.get("peer")
            peer = peer if isinstance(peer, Mapping) else {}
            made = conn(peer.get("id"), "psk", peer.get("address"), t.get("remoteSubnets"))
            peers[t["name"]] = PeerNow(secret=psk, conn=made)
        return StillAsked(peers, names("exposures"), names("reverseExposures"), legacy=True)
    default_psk = ref(section("ipsec").get("pskSecretRef"))
    cert_ref = section("ipsec").get("certificateSecretRef")
    cert_name = cert_ref.get("name") if isinstance(cert_ref, Mapping) else None
    certificate_secret = (cert_name if isinstance(cert_name, str) else None,)
    for doc in snap.peers:
        name = str((doc.get("metadata") or {}).get("name"))
        if name not in valid_peers:
            continue
        pspec = doc.get("spec") or {}
        pi, pw = pspec.get("ipsec") or {}, pspec.get("wireguard") or {}
        authz = pspec.get("authorization") or {}
        grants = {("exposure", e) for e in authz.get("exposures") or []}
        grants |= {("reverse", e) for e in authz.get("reverseExposures") or []}
        site = pspec.get("endpoint") if pspec.get("type") == "site" else None
        if pw:
            secret = ref(pw.get("presharedKeySecretRef"))
            made = conn(None, None, site, pw.get("allowedIPs"))
        else:
            secret = ref(pi.get("pskSecretRef")) or default_psk
            made = conn(pi.get("id"), pi.get("auth") or "psk", site, pi.get("remoteSubnets"))
        peers[name] = PeerNow(
            secret=secret, public_key=pw.get("publicKey"), grants=frozenset(grants), conn=made
        )
    return StillAsked(
        peers, names("exposures"), names("reverseExposures"), certificate_secret=certificate_secret
    )


@dataclass(frozen=True)
class Claim:
    """A gateway's hold on a serviceCIDR: the one its deployed plan serves, else the one its spec asks."""

    key: GatewayKey
    service_cidr: str
    deployed: bool
    created: str
    """``metadata.creationTimestamp`` (RFC 3339: sorts as text)."""

    def rank(self) -> tuple[bool, str, str]:
        """Who keeps a contested range: what is served first, then the older gateway, then by name."""
        return (not self.deployed, self.created, str(self.key))


def claim_of(key: GatewayKey, gateway: Mapping[str, Any], deployed_cidr: str | None) -> Claim | None:
    """``gateway``'s claim (None: it has no deployed plan and no readable serviceCIDR)."""
    md = gateway.get("metadata") or {}
    created = str(md.get("creationTimestamp") or "")
    if deployed_cidr is not None:
        return Claim(key, deployed_cidr, True, created)
    spec_cidr = (gateway.get("spec") or {}).get("serviceCIDR")
    if not isinstance(spec_cidr, str):
        return None
    try:
        return Claim(key, str(ipaddress.IPv4Network(spec_cidr, strict=False)), False, created)
    except ValueError:
        return None


def neighbours(mine: Claim, others: Sequence[Claim]) -> tuple[Neighbour, ...]:
    """The other gateways overlapping ``mine`` whose claims outrank it (``mine``: the claim of this
    gateway's spec serviceCIDR, ``deployed`` when its deployed plan already serves an overlapping range):
    they keep the range, and this gateway gets ``ServiceCIDRTaken``. A gateway that moves its serviceCIDR
    onto a range another one serves never wins it; of two new ones, the older does (pure)."""
    net = ipaddress.IPv4Network(mine.service_cidr)
    return tuple(
        Neighbour(f"{o.key.kind}/{o.key.namespace}/{o.key.name}", o.service_cidr)
        for o in sorted(others, key=Claim.rank)
        if o.key != mine.key
        and o.rank() < mine.rank()
        and ipaddress.IPv4Network(o.service_cidr).overlaps(net)
    )


def my_claim(key: GatewayKey, gateway: Mapping[str, Any], deployed_cidr: str | None) -> Claim | None:
    """This gateway's claim on the range its spec asks for: ``deployed`` only when the deployed plan
    already serves all of it (narrowing keeps the claim; widening, or moving, onto a range someone else
    holds is never a deployed claim: found by review, an older gateway widened over a younger one's)."""
    asked = claim_of(key, gateway, None)
    if asked is None:
        return None
    if deployed_cidr is not None and ipaddress.IPv4Network(asked.service_cidr).subnet_of(
        ipaddress.IPv4Network(deployed_cidr)
    ):
        return dataclasses.replace(asked, deployed=True)
    return asked


def holds(claim: Claim, enabled: bool, allowed: Sequence[str] | None, refused: bool = False) -> bool:
    """Whether ``claim`` keeps other gateways off its range: a served range always does; a range only
    asked for does from an enabled namespace, inside the namespace's allowance (``allowed``: its
    ``serviceCIDRs``, None: any), and while its gateway is not refused (``refused``, from its status:
    ``refused_as_is``), else a CR that can never render would block a range others need."""
    if claim.deployed:
        return True
    return enabled and within(claim.service_cidr, allowed) and not refused


def within(cidr: str, allowed: Sequence[str] | None) -> bool:
    """``cidr`` lies inside one of a namespace's allowed serviceCIDRs (``allowed`` None: any range)."""
    net = ipaddress.IPv4Network(cidr)
    return allowed is None or any(net.subnet_of(ipaddress.IPv4Network(c)) for c in allowed)


NOT_ITS_OWN = frozenset({"PartlyRendered", TRANSIT_UNKNOWN, "SecretsUnreadable", "ServiceCIDRTaken"})
"""ConfigRendered reasons that say nothing against a gateway's claim: parts left out, the controller not
able to look yet (the cloud, the tenant's Secrets), or the range held by another (found by review: these
handed an older gateway's claim to whichever contender reconciled first)."""


def refused_as_is(gateway: Mapping[str, Any]) -> bool:
    """Whether the gateway's status says this very generation was refused whole (``ConfigRendered`` False
    for a reason of its own, not parts left out). Found by review: a WireGuard gateway whose private key
    is never opted in held its range forever without rendering, against every younger gateway. A status
    of another generation (or none yet) says nothing: the claim holds meanwhile."""
    md, status = gateway.get("metadata") or {}, gateway.get("status") or {}
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == CONFIG_RENDERED:
            return (
                c.get("status") == "False"
                and c.get("reason") not in NOT_ITS_OWN
                and c.get("observedGeneration") is not None
                and c.get("observedGeneration") == md.get("generation")
            )
    return False


@dataclass(frozen=True)
class Links:
    """The ClusterLinks naming a gateway, split by the namespace's allowance."""

    routers: tuple[str, ...] = ()
    """The routers its reverse-exposure routes go to."""
    refused: tuple[tuple[str, str], ...] = ()
    """(ClusterLink name, router id) of the links naming a router the namespace may not use."""
    unscoped: tuple[str, ...] = ()
    """The namespace's ClusterLinks that name no gateway at all: the seed's shape (its links carried every
    gateway's routes); this release routes only the gateways a link names, so they carry none."""


def cluster_links(key: GatewayKey, links: Iterable[Mapping[str, Any]], allowed: Sequence[str]) -> Links:
    """The ClusterLinks of ``key``'s namespace that name it, each router checked against the namespace's
    allowance (``Settings.allowance``): a tenant must not get its routes onto a router it does not own."""
    routers: set[str] = set()
    refused: list[tuple[str, str]] = []
    unscoped: list[str] = []
    for link in links:
        md, spec = link.get("metadata") or {}, link.get("spec") or {}
        router = spec.get("routerID")
        if md.get("namespace") != key.namespace or not router:
            continue
        if not spec.get("gateways"):
            unscoped.append(str(md.get("name")))
        if key.name not in (spec.get("gateways") or []):
            continue
        if str(router) in allowed:
            routers.add(str(router))
        else:
            refused.append((str(md.get("name")), str(router)))
    return Links(tuple(sorted(routers)), tuple(sorted(refused)), tuple(sorted(unscoped)))


def links_condition(key: GatewayKey, links: Links, cloud: Sequence[Condition]) -> Condition | None:
    """RoutingReady from the ClusterLinks, where they explain more than the cloud's own condition: a
    router outside the allowance, or (the cloud found no router for the virtual IPs) links in the seed's
    shape that name no gateway."""
    if not links.refused:
        no_router = any(c.type == ROUTING_READY and c.reason == NO_ROUTER for c in cloud)
        if not (no_router and links.unscoped and not links.routers):
            return None
        names = ", ".join(links.unscoped)
        return Condition(
            ROUTING_READY,
            False,
            "ClusterLinkNamesNoGateways",
            f"ClusterLink {names} names no gateways (the earlier release's shape, where a link carried every "
            f"gateway's routes; this release routes only the gateways a link names): add {key.name} to its "
            "spec.gateways",
        )
    names = ", ".join(f"ClusterLink {n} (router {r})" for n, r in links.refused)
    return Condition(
        ROUTING_READY,
        False,
        "RouterNotAllowed",
        f"{names}: the operator's allowances for namespace {key.namespace} do not include the router "
        f"(the chart's allowances.namespaces.{key.namespace}.clusterLinkRouters); "
        "no route was programmed on it",
    )


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
class Report:
    """What a gateway's status is computed from (``outcome``): the decision's conditions and what the
    decision saw, so that the executor can add the writes the API refused without deciding anything."""

    parts: tuple[Condition, ...]
    """Every condition but ``Ready`` (computed from them) and ``OwnedObjects`` (``owned_condition``)."""
    foreign: tuple[str, ...]
    """``Kind/namespace/name`` of the objects of our name that are someone else's."""
    seen: Mapping[str, Any]
    """The status the decision saw."""
    generation: int
    node: str | None
    public_ip: str | None
    now: str
    also: tuple[StatusEvent, ...] = ()
    """Events of the decision that no condition carries (``Repinned``, ``Failover``)."""
    ha: Mapping[str, Any] | None = None
    """``status.ha`` of an HA gateway (``controller.ha.ha_status``); None: no HA."""


def outcome(report: Report, failures: Sequence[WriteFailure] = ()) -> tuple[Obj | None, list[StatusEvent]]:
    """The status patch (None: already so) and the Events of a reconcile whose writes ``failures`` were
    refused by the API. Events come from condition transitions against the status the decision saw, so a
    failure that stays the same says so once, not on every retry."""
    parts = list(report.parts)
    owned = status.owned_condition(report.foreign, failures)
    if owned is not None:  # where it always stood: after PodReady, before DeployedPlan
        at = next((i for i, c in enumerate(parts) if c.type == DEPLOYED_PLAN), len(parts))
        parts.insert(at, owned)
    before = list(report.seen.get("conditions") or [])
    conds = status.conditions(parts, before, report.generation, report.now)
    wanted: Obj = {
        "conditions": conds,
        "observedGeneration": report.generation,
        "nodeName": report.node,
        "publicIP": report.public_ip,
        "ha": dict(report.ha) if report.ha is not None else None,
    }
    return status.status_patch(report.seen, wanted), [*status.events(before, conds), *report.also]


@dataclass(frozen=True)
class Decision:
    actions: tuple[diff.Action, ...]
    foreign: tuple[diff.Foreign, ...]
    status: Obj | None
    """The merge patch of the controller's status keys; None: already so."""
    events: tuple[StatusEvent, ...]
    desired: Desired | None
    report: Report | None = None
    """What ``status`` and ``events`` were computed from (``outcome`` with no failures)."""


LEFT_OUT = "PartlyRendered"


def config_condition(rendered: Rendered) -> Condition:
    """``ConfigRendered``: True when every part rendered; False naming every problem, either with the
    parts left out of a deployed plan (reason ``PartlyRendered``) or, when the gateway itself is invalid,
    with the first problem's reason and what keeps running."""
    problems = "; ".join(str(p) for p in rendered.problems)
    if rendered.plan is None:
        kept = (
            " (the deployed plan keeps running, without what was removed or revoked since)"
            if rendered.kept is not None
            else ""
        )
        reason = next((p.reason for p in rendered.problems if p.item.kind == "gateway"), None)
        return Condition(
            CONFIG_RENDERED, False, reason or rendered.problems[0].reason or "Invalid", problems + kept
        )
    p = rendered.plan
    what = (
        f"{len(p.ipsec.tunnels)} tunnel(s)"
        if p.ipsec is not None
        else f"{len(p.wireguard.peers) if p.wireguard else 0} WireGuard peer(s)"
    )
    summary = f"plan {gwplan.plan_hash(p)[:19]}: {what}, {len(p.nat.grants)} grant(s)"
    if rendered.problems:
        parts = sorted({str(q.item) for q in rendered.problems})
        return Condition(
            CONFIG_RENDERED, False, LEFT_OUT, f"{summary}; left out ({', '.join(parts)}): {problems}"
        )
    return Condition(CONFIG_RENDERED, True, "Rendered", summary)


def pod_condition(snap: Snapshot, node: str | None, nic: bool, where: placement.Placement) -> Condition:
    if node is None:
        # No node (none can take it, or nothing renders): NIC2 follows a node, so the node is the cause.
        return Condition(POD_READY, False, where.reason, where.message)
    if not nic:
        return Condition(POD_READY, False, "NoNIC2", "waiting for the cloud to provide NIC2")
    pods = [
        p
        for p in snap.pods
        if not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("spec") or {}).get("nodeName") == node
    ]
    failure = replica_failure(snap.owned.get("Deployment"))
    if not pods:
        if failure is not None:
            return failure
        return Condition(POD_READY, False, "NoPod", f"no gateway pod on node {node} yet")
    pod = sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp", "")))[-1]
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return Condition(POD_READY, True, "PodReady", f"pod {pod['metadata']['name']} is ready on {node}")
    if failure is not None:  # a replacement that cannot be created says more than the pod that is going
        return failure
    waiting = [
        f"{cs.get('name')}: {(cs.get('state') or {}).get('waiting', {}).get('reason')}"
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
        if (cs.get("state") or {}).get("waiting")
    ]
    phase = st.get("phase") or "Pending"
    detail = f" ({', '.join(waiting)})" if waiting else ""
    # A pod the kubelet rejected (e.g. SysctlForbidden) or evicted says why in its status.
    why = ": ".join(str(x) for x in (st.get("reason"), st.get("message")) if x)
    detail += f": {why}" if why else ""
    return Condition(POD_READY, False, "PodNotReady", f"pod {pod['metadata']['name']} is {phase}{detail}")


def replica_failure(deployment: Mapping[str, Any] | None) -> Condition | None:
    """``PodReady=False`` from the Deployment's ``ReplicaFailure`` condition: the controller-manager's
    ReplicaSet controller could not create the pod (PodSecurity admission, a ResourceQuota, a missing
    ServiceAccount, ...) and the Deployment controller copies the ReplicaSet's condition (reason
    ``FailedCreate``, the API's refusal as its message); it is removed once a pod could be created."""
    st = (deployment or {}).get("status") or {}
    for c in st.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return Condition(
                POD_READY,
                False,
                str(c.get("reason") or "FailedCreate"),
                f"the gateway pod cannot be created: {c.get('message') or 'no reason given'}",
            )
    return None


def decide(
    snap: Snapshot,
    settings: Settings,
    rendered: Rendered,
    where: placement.Placement,
    cloud: CloudState,
    now: str,
    pair: HaPlan | None = None,
    nic_b: Nic2 | None = None,
) -> Decision:
    """``where``: slot a's placement; ``pair``: an HA gateway's part (``plan_ha``), with ``nic_b`` its slot
    b's NIC2 as the cloud reports it."""
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
        slot_b = None
        if pair is not None and pair.mode != "off":
            node_b = pair.slot_b.node if pair.mode == "full" else None
            slot_b = HaInputs(node_b, nic_b, pair.lease, cloud.floating_ip_slot)
        inputs = Inputs(snap.key, snap.uid, plan, settings, cloud.nic, where.node, snap.secrets, slot_b)
        plan_desired = desired(inputs)
        held: set[str] = set()
        if pair is not None and pair.hold_b:
            plan_desired = Desired(
                tuple((s, o) for s, o in plan_desired.objects if s != "Deployment/b"),
                plan_desired.held | {"Deployment/b"},
            )
        if pair is not None and pair.mode == "full":
            waits = rollout_waits(snap.owned, plan_desired.objects, pair.active)
            if waits is not None:
                plan_desired = Desired(
                    tuple((s, o) for s, o in plan_desired.objects if s != waits),
                    plan_desired.held | {waits},
                )
        if pair is not None and pair.mode == "drain":
            # HA off, a pod of slot b still there: slot b's objects go (surplus), the Lease and slot a's
            # plan section stay until its pods are gone, so that the leaving standby never takes the Lease.
            plan_desired = Desired(
                tuple((s, o) for s, o in plan_desired.objects if s not in SLOT_B),
                plan_desired.held - set(SLOT_B),
            )
        if cloud.nic is None:
            # Without NIC2 nothing can run: keep what exists (a running pod keeps its plan) and add only
            # what does not depend on it.
            held = {"ConfigMap", "NetworkAttachmentDefinition", "Deployment"}
        elif "Deployment" not in snap.owned and moving(snap, settings):
            # The pod an earlier release ran in the tenant's namespace still holds NIC2 (host-device moved
            # it into its netns): the new one starts once it is gone.
            held = {"Deployment"}
        if pair is not None and pair.keep_lease:
            held.add("Lease")
        if not snap.namespace_enabled or snap.secrets_unreadable is not None:
            # What the tenant's namespace holds cannot be read: its Role (with the pod's Secret grants) is
            # left as it is, never rewritten from what is not known (a pod restarted meanwhile would
            # come up without its keys).
            held |= set(TENANT_SLOTS)
        if held:
            plan_desired = Desired(
                tuple((slot, o) for slot, o in plan_desired.objects if slot not in held),
                plan_desired.held | held,
            )
        acts, foreign = diff.plan_actions(plan_desired.objects, snap.owned, snap.uid)
        actions = list(acts)
        # What only HA has, once HA no longer wants it (slot b, then the Lease).
        actions += diff.surplus(
            plan_desired.objects, plan_desired.held, snap.owned, snap.uid, HA_SLOTS, "HA is off"
        )
        if pair is not None and pair.handover is not None:
            md = pair.handover["metadata"]
            why = "HA is off: slot b hands over to slot a (its agent releases the Lease as it stops)"
            actions.append(diff.Delete("Pod", str(md["namespace"]), str(md["name"]), str(md.get("uid")), why))
    if settings.migrate:
        actions += diff.deletions(snap.leftovers, snap.uid, "moved to the gateway namespace")
    routing = links_condition(snap.key, snap.links, cloud.conditions)
    parts = [
        config_condition(rendered),
        *(c for c in cloud.conditions if routing is None or c.type != ROUTING_READY),
    ]
    if routing is not None:
        parts.append(routing)
    if not any(c.type == CLOUD_READY for c in cloud.conditions):
        parts.append(Condition(CLOUD_READY, True, "Ready", "the cloud holds what the gateway needs"))
    serving_where = where
    if pair is not None and pair.mode == "full":
        serving_where = pair.decision.placement.of(pair.active)
        parts.append(
            Condition(
                ha.STANDBY_READY,
                False,
                "StandbyPending",
                "slot b's pod starts once slot a's pod holds the gateway's Lease (its agent takes it within "
                "a second of its plan naming it)",
            )
            if pair.hold_b
            else pair.decision.condition
        )
    elif ha_requested(snap.gateway) and not settings.ha_allowed:
        parts.append(
            Condition(
                ha.STANDBY_READY,
                False,
                "HANotAllowed",
                "spec.ha.enabled: the operator does not allow warm-standby HA here (the controller's "
                "--allow-ha, the chart's ha.allowed; docs/ha.md): the gateway runs one pod",
            )
        )
    parts.append(pod_condition(snap, serving_where.node, cloud.nic is not None, serving_where))
    if rendered.previous_error and rendered.plan is None:
        parts.append(Condition(DEPLOYED_PLAN, False, "PreviousPlanInvalid", rendered.previous_error))
    report = Report(
        parts=tuple(parts),
        foreign=tuple(f"{f.kind}/{f.name}" for f in foreign),
        seen=snap.current_status,
        generation=snap.generation,
        node=serving_where.node if serving_where.node is not None else snap.current_node,
        public_ip=cloud.public_ip,
        now=now,
        also=(
            *(
                (StatusEvent("Normal", "Repinned", where.message),)
                if where.moved_from is not None and where.node is not None
                else ()
            ),
            *(pair.decision.events if pair is not None and pair.mode == "full" else ()),
        ),
        ha=pair.decision.status if pair is not None and pair.mode == "full" else None,
    )
    patch, evts = outcome(report)
    return Decision(
        tuple(actions),
        tuple(foreign),
        patch,
        tuple(evts),
        plan_desired,
        report,
    )


def rollout_done(deployment: Mapping[str, Any]) -> bool:
    """The Deployment's pods all run its current template and are available (``kubectl rollout status``'s
    test: the controller saw this generation, every replica updated, no old one left, all available)."""
    md, spec, st = (
        deployment.get("metadata") or {},
        deployment.get("spec") or {},
        deployment.get("status") or {},
    )
    want = int(spec.get("replicas", 1))
    return (
        int(st.get("observedGeneration") or 0) >= int(md.get("generation") or 0)
        and int(st.get("updatedReplicas") or 0) >= want
        and int(st.get("replicas") or 0) <= int(st.get("updatedReplicas") or 0)
        and int(st.get("availableReplicas") or 0) >= int(st.get("updatedReplicas") or 0)
    )


def rollout_waits(
    owned: Mapping[str, Mapping[str, Any]], objects: Sequence[tuple[str, Mapping[str, Any]]], active: ha.Slot
) -> str | None:
    """An HA gateway's pod template changes (a new image, a log format): the standby's Deployment rolls
    first, the active's only once the standby's has rolled out (its new pod available), so that the
    active's roll (its pod stopping releases the Lease) hands over to a standby already running the new
    template, instead of both pods restarting at once. The slot to hold back now, or None. Nothing is held
    without a standby's Deployment to roll first; a standby whose new pod never becomes available (a bad
    image) keeps the active on the old template: a canary."""
    active_slot, standby_slot = (
        ("Deployment", "Deployment/b") if active == "a" else ("Deployment/b", "Deployment")
    )
    want = dict(objects)
    have_active, have_standby = owned.get(active_slot), owned.get(standby_slot)
    if have_active is None or have_standby is None or active_slot not in want:
        return None

    def changes(slot: str, have: Mapping[str, Any]) -> bool:
        wanted = ((want.get(slot) or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_HASH)
        return bool(wanted != ((have.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH))

    if not changes(active_slot, have_active):
        return None
    standby_rolling = standby_slot in want and changes(standby_slot, have_standby)
    return active_slot if standby_rolling or not rollout_done(have_standby) else None


def ha_requested(gateway: Mapping[str, Any]) -> bool:
    """``spec.ha.enabled`` (read raw: a gateway that does not render still has its pair placed)."""
    return bool(((gateway.get("spec") or {}).get("ha") or {}).get("enabled"))


def ha_pins(snap: Snapshot) -> ha.Pins:
    """Each slot's Deployment's node now."""

    def node(slot: str) -> str | None:
        dep = snap.owned.get(slot) or {}
        pinned = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeName")
        return str(pinned) if pinned else None

    return {"a": node("Deployment") or snap.current_status.get("nodeName"), "b": node("Deployment/b")}


def ha_pods(snap: Snapshot, settings: Settings) -> tuple[Mapping[str, Any], ...]:
    """The gateway's pods HA decides over: those in the gateway namespace only. A pod in the tenant's own
    namespace with the gateway's labels is an earlier release's leftover (or anyone's forgery there): it
    must never count as a slot (found by review: one labelled ha-slot b switched HA's machinery on)."""
    return tuple(
        p for p in snap.pods if (p.get("metadata") or {}).get("namespace") == settings.gateway_namespace
    )


def ha_involved(snap: Snapshot, settings: Settings) -> bool:
    """``snap``'s gateway wants HA, or something of HA the controller made is left to wind down (slot b's
    objects or pods, the Lease). ``status.ha`` alone is no evidence: the pod's own ServiceAccount may patch
    its CR's status."""
    if ha_requested(snap.gateway):
        return True
    return any(s in snap.owned for s in HA_SLOTS) or any(
        ha.slot_of_pod(p) == "b" for p in ha_pods(snap, settings)
    )


def trusted_status(snap: Snapshot, cloud_slot: ha.Slot | None) -> Mapping[str, Any]:
    """The status ``controller.ha`` reads where the floating IP is (``status.ha.activeSlot``), corrected by
    what the controller knows itself: the slot its last cloud step left the floating IP on, when this
    replica made one (a status write lost after a move, or a controller restarted, must not move it back);
    and never slot b while the controller has no slot b (a status patched by the pod or the tenant)."""
    status = snap.current_status
    recorded = ha.recorded_slot(status)
    slot = cloud_slot or recorded
    if slot == "b" and "Deployment/b" not in snap.owned and cloud_slot is None:
        slot = "a"
    if slot == recorded:
        return status
    return {**status, "ha": {**(status.get("ha") or {}), "activeSlot": slot}}


@dataclass(frozen=True)
class HaPlan:
    """An HA gateway's part of one reconcile (``plan_ha``)."""

    mode: str
    """``full``: both slots; ``drain``: HA is off and slot b's pods are going (slot b's objects go, the
    Lease and slot a's ``ha`` plan section stay); ``off``: nothing of HA is left to keep (the Lease goes)."""
    decision: ha.HaDecision
    slot_a: placement.Placement
    slot_b: placement.Placement
    active: ha.Slot
    """Where the floating IP, the address pairs and the routes belong: the serving slot, else where they
    are, else slot a."""
    lease: gwplan.Ha
    handover: Mapping[str, Any] | None = None
    """HA being turned off while slot b serves: slot b's pod to delete (gracefully: its agent releases the
    Lease) once slot a stands by Ready, so that slot a, the one that stays, takes over."""
    hold_b: bool = False
    """HA just turned on for a serving gateway: slot b's Deployment waits until slot a's pod holds the
    Lease."""
    keep_lease: bool = False
    """HA off: the Lease stays while its holder still renews it."""


def plan_ha(
    snap: Snapshot,
    settings: Settings,
    observed: ha.Observation,
    now: float,
    wall: str,
    cloud_slot: ha.Slot | None = None,
) -> HaPlan | None:
    """The HA part of ``snap``'s reconcile: None for a gateway that has and wants nothing of HA.
    ``cloud_slot``: where this replica's last cloud step left the floating IP (None: it made none)."""
    if not ha_involved(snap, settings):
        return None
    requested = ha_requested(snap.gateway) and settings.ha_allowed
    pins = ha_pins(snap)
    pods = ha_pods(snap, settings)
    status = trusted_status(snap, cloud_slot)
    decision = ha.decide(
        status=status,
        pins=pins,
        observed=observed,
        now=now,
        wall=wall,
        pods=pods,
        nodes=snap.nodes,
        pinned=snap.pinned,
        selector=settings.pod.node_selector,
        tolerations=settings.pod.tolerations,
        cap=settings.pod.max_gateways_per_node,
    )
    serving = decision.serving.slot or ha.recorded_slot(status) or "a"
    lease = gwplan.Ha(snap.key.home_name, settings.ha_lease_seconds, settings.ha_renew_seconds)
    if requested:
        a, b = decision.placement.a, decision.placement.b
        # Turned on for a gateway that serves: slot b's pod waits until slot a's holds the Lease (its plan
        # names it now), else slot b's agent, first to find it free, would take it from the pod serving.
        running_a = ha.slot_pod(pods, "a", pins.get("a")) is not None
        any_b = "Deployment/b" in snap.owned or any(ha.slot_of_pod(p) == "b" for p in pods)
        hold_b = decision.serving.holder is None and running_a and not any_b
        return HaPlan("full", decision, a, b, serving, lease, hold_b=hold_b)
    if serving == "b" and "Deployment/b" in snap.owned:
        # Turned off while slot b serves: slot a stays (its names are the gateway's), so slot b hands over
        # first; meanwhile both run as before.
        stb = ha.slot_pod(pods, "a", pins.get("a"))
        ready_a = ha.standby_ready(pods, snap.nodes, "a", pins.get("a"))
        pod_b = ha.slot_pod(pods, "b", pins.get("b"))
        handover = pod_b if stb is not None and ready_a and pod_b is not None else None
        a, b = decision.placement.a, decision.placement.b
        return HaPlan("full", decision, a, b, "b", lease, handover)
    where = place(snap, settings)
    none = placement.Placement(None, "HaOff", "HA is off")
    mode = "drain" if any(ha.slot_of_pod(p) == "b" for p in pods) else "off"
    # The Lease goes once nobody renews it: slot a's agent stops when its plan loses ``ha`` (deleted at
    # once, a holder that reads it before its new plan would stand down and cut every tunnel).
    keep_lease = mode == "off" and "Lease" in snap.owned and ha.valid_holder(observed, now) is not None
    return HaPlan(mode, decision, where, none, "a", lease, keep_lease=keep_lease)


def moving(snap: Snapshot, settings: Settings) -> bool:
    """A pod of this gateway still runs outside the gateway namespace (an earlier release's)."""
    return any((p.get("metadata") or {}).get("namespace") != settings.gateway_namespace for p in snap.pods)


def cleanup(snap: Snapshot) -> list[diff.Delete]:
    """What the gateway's finalizer deletes: its objects in the gateway namespace (nothing there can
    carry an ownerReference to it) and what an earlier release left in its namespace. Its Role and
    RoleBinding in its own namespace go with it (garbage collector)."""
    home = [o for slot, o in snap.owned.items() if slot in HOME_SLOTS]
    return diff.deletions([*home, *snap.leftovers], snap.uid, "the gateway is deleted")


def orphans(key: GatewayKey, home: Sequence[Mapping[str, Any]]) -> list[diff.Delete]:
    """What the gateway namespace holds for ``key`` while no such gateway exists (its finalizer removed
    by hand, its CRD deleted): nothing there can carry an ownerReference to the CR, so no garbage
    collector takes it, and a privileged pod must not outlive its gateway. Each goes with its own uid as
    the precondition."""
    out: list[diff.Delete] = []
    for obj in home:
        uid = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_OWNER_UID)
        if uid and owner_of(obj) == key:
            out += diff.deletions([obj], str(uid), "its gateway no longer exists")
    return out


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
