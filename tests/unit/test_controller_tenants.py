"""Tenants on one transit network stay apart (pure decisions): disjoint serviceCIDRs across gateways (the
one that has it keeps it), none on NIC2's network, exposure targets and ClusterLink routers only inside
what the operator allows each namespace."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from controller.names import GatewayKey
from controller.reconcile import (
    Claim,
    Links,
    claim_of,
    cluster_links,
    holds,
    my_claim,
    neighbours,
    refused_as_is,
    render_gateway,
)
from controller.settings import Allowance, NetworkPolicySettings, Settings, SettingsError, from_config
from controller.status import Condition
from tests.examples import edit, example_docs
from tests.unit.test_controller_desired import CLOUD, applied, run, snapshot, written, written_plan

IPSEC = example_docs("ipsec.yaml")
FABRIC = Allowance(exposure_targets=("192.0.2.64/26",))
SETTINGS = Settings(internal_source_cidrs=("192.0.2.64/26",), default_allowance=FABRIC)


def key(name: str, ns: str = "tenant-a") -> GatewayKey:
    return GatewayKey("VPNGateway", ns, name)


def gateway(cidr: str, created: str) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "spec": {"serviceCIDR": cidr}}


def conditions(d: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in d.status["conditions"]}


# --- serviceCIDRs across gateways ---------------------------------------------------------------------


def test_a_gateway_moving_onto_a_served_range_never_wins_it_even_when_older() -> None:
    served = claim_of(key("b"), gateway("198.18.0.0/24", "2026-02-01T00:00:00Z"), "198.18.0.0/24")
    assert served is not None and served.deployed
    # a (older) moves from 198.18.5.0/24 onto b's range
    mine = my_claim(key("a"), gateway("198.18.0.0/25", "2026-01-01T00:00:00Z"), "198.18.5.0/24")
    assert mine is not None and not mine.deployed
    assert [n.resource for n in neighbours(mine, [served])] == ["VPNGateway/tenant-a/b"]
    # ... and b, serving it, is not held back by a's claim
    b_mine = my_claim(key("b"), gateway("198.18.0.0/24", "2026-02-01T00:00:00Z"), "198.18.0.0/24")
    a_claim = claim_of(key("a"), gateway("198.18.0.0/25", "2026-01-01T00:00:00Z"), "198.18.5.0/24")
    assert b_mine is not None and a_claim is not None
    assert neighbours(b_mine, [a_claim]) == ()


def test_widening_over_a_younger_gateways_served_range_never_wins_it() -> None:
    """Found by review: B (older) widened its deployed /24 to a /8 over A's deployed range; the overlap with
    its own old range made it a 'deployed' claim, it won on age and froze A."""
    a = claim_of(key("a"), gateway("10.9.0.0/24", "2026-02-01T00:00:00Z"), "10.9.0.0/24")
    b_wide = my_claim(key("b"), gateway("10.0.0.0/8", "2026-01-01T00:00:00Z"), "10.200.0.0/24")
    assert a is not None and b_wide is not None and not b_wide.deployed
    assert [n.resource for n in neighbours(b_wide, [a])] == ["VPNGateway/tenant-a/a"], "B is refused"
    b_narrow = my_claim(key("b"), gateway("10.200.0.0/25", "2026-01-01T00:00:00Z"), "10.200.0.0/24")
    assert b_narrow is not None and b_narrow.deployed, "narrowing what it serves keeps its claim"


def test_of_two_new_gateways_the_older_keeps_the_range() -> None:
    old = claim_of(key("old"), gateway("198.18.0.0/24", "2026-01-01T00:00:00Z"), None)
    new = claim_of(key("new"), gateway("198.18.0.0/24", "2026-01-02T00:00:00Z"), None)
    assert old is not None and new is not None
    assert [n.resource for n in neighbours(new, [old])] == ["VPNGateway/tenant-a/old"]
    assert neighbours(old, [new]) == ()


@pytest.mark.parametrize("namespace", ["tenant-acme", "tenant-b"])
def test_a_taken_service_cidr_refuses_the_gateway_naming_the_other_only_in_its_own_namespace(
    namespace: str,
) -> None:
    """Another tenant's gateway, namespace and range are not told (found by review: a tenant trying wider
    serviceCIDRs would map every other tenant's); a gateway of the same namespace is named."""
    other = Claim(key("first", namespace), "198.18.0.0/16", True, "2026-01-01T00:00:00Z")
    mine = my_claim(key("acme", "tenant-acme"), snapshot(IPSEC).gateway, None)
    assert mine is not None
    snap = snapshot(IPSEC, neighbours=neighbours(mine, [other]))
    d = run(snap, SETTINGS)
    cond = conditions(d)["ConfigRendered"]
    assert (cond["status"], cond["reason"]) == ("False", "ServiceCIDRTaken")
    if namespace == "tenant-acme":
        told = "overlaps VPNGateway/tenant-acme/first's serviceCIDR 198.18.0.0/16, which it had first"
        assert told in cond["message"]
    else:
        told = "overlaps the serviceCIDR of a gateway in another namespace, which it had first"
        assert told in cond["message"]
        assert "tenant-b" not in cond["message"] and "198.18.0.0/16" not in cond["message"]
    assert "ConfigMap" not in written(d), "nothing rendered"


def test_a_service_cidr_on_the_transit_network_is_refused() -> None:
    """A virtual IP on NIC2's network could claim another gateway's NIC2 address (the cloud's
    allowed-address-pairs would let it)."""
    rendered = render_gateway(snapshot(edit(IPSEC, 0, ["spec", "serviceCIDR"], "192.0.2.0/27")), SETTINGS,
                              ("192.0.2.0/26",))  # fmt: skip
    assert rendered.plan is None
    assert [p.reason for p in rendered.problems if p.item.kind == "gateway"] == ["OverlapsTransitNetwork"]
    assert render_gateway(snapshot(IPSEC), SETTINGS, ("192.0.2.0/26",)).plan is not None


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("169.254.1.1/24", "ReservedRange"),  # the metadata service would be routed into wg0
        ("100.64.0.1/24", "ReservedRange"),  # the API server's endpoint (networkPolicy.apiServer)
        ("192.0.2.1/28", "OverlapsTransitNetwork"),
    ],
)
def test_a_wireguard_tunnel_subnet_must_not_take_the_pods_own_routes(address: str, reason: str) -> None:
    """Found by review: spec.wireguard.address was checked against the serviceCIDR alone, yet its
    subnet becomes a route into wg0 in the pod."""
    wg = edit(example_docs("wireguard.yaml"), 0, ["spec", "wireguard", "address"], address)
    settings = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        default_allowance=FABRIC,
        network_policy=NetworkPolicySettings(api_server=(("100.64.0.10/32", 6443),)),
    )
    rendered = render_gateway(snapshot(wg), settings, ("192.0.2.0/27",))
    assert rendered.plan is None
    (problem,) = [p for p in rendered.problems if p.item.kind == "gateway"]
    assert (problem.reason, problem.error.path) == (reason, "spec.wireguard.address")
    fine = render_gateway(snapshot(example_docs("wireguard.yaml")), settings, ("192.0.2.0/27",))
    assert fine.plan is not None


def test_a_wireguard_tunnel_subnet_meets_internal_sources_only_through_reverse_exposures() -> None:
    wg = edit(example_docs("wireguard.yaml"), 0, ["spec", "wireguard", "address"], "192.0.2.65/28")
    assert render_gateway(snapshot(wg), SETTINGS).plan is not None, "no reverse exposure: they never meet"
    printer = IPSEC[0]["spec"]["reverseExposures"]
    with_reverse = edit(wg, 0, ["spec", "reverseExposures"], printer)
    rendered = render_gateway(snapshot(with_reverse), SETTINGS)
    assert rendered.plan is None
    assert [p.reason for p in rendered.problems if p.item.kind == "gateway"] == [
        "OverlapsInternalSourceCIDRs"
    ]


def test_a_service_cidr_outside_the_namespaces_allowance_is_refused_naming_the_chart_value() -> None:
    only = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        allowances={"tenant-acme": Allowance(("192.0.2.64/26",), (), ("198.18.8.0/21",))},
    )
    rendered = render_gateway(snapshot(IPSEC), only)  # 198.18.0.0/24
    assert rendered.plan is None
    (problem,) = [p for p in rendered.problems if p.item.kind == "gateway"]
    assert problem.reason == "ServiceCIDRNotAllowed" and problem.error.path == "spec.serviceCIDR"
    assert "allowances.namespaces.tenant-acme.serviceCIDRs" in str(problem)
    inside = edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.9.0/24")
    assert render_gateway(snapshot(inside), only).plan is not None


def test_only_a_served_range_or_one_asked_from_an_enabled_namespace_within_its_allowance_holds() -> None:
    """A CR that can never render (its namespace not enabled, its range not allowed) must not keep
    other tenants off a range."""
    asked = Claim(key("a"), "198.18.0.0/24", False, "2026-01-01T00:00:00Z")
    assert holds(asked, True, None) and holds(asked, True, ("198.18.0.0/16",))
    assert not holds(asked, False, None), "namespace not enabled"
    assert not holds(asked, True, ("198.18.1.0/24",)), "outside the namespace's serviceCIDRs"
    served = Claim(key("a"), "198.18.0.0/24", True, "2026-01-01T00:00:00Z")
    assert holds(served, False, ("10.0.0.0/8",)), "what a pod serves holds until it stops"
    assert not holds(asked, True, None, refused=True), "a gateway refused as it is"
    assert holds(served, True, None, refused=True), "a refused gateway's deployed plan still serves it"


def test_a_gateway_whose_status_says_it_was_refused_holds_no_range() -> None:
    """Found by review: a gateway that can never render (a private key never opted in) squatted its
    range against every younger gateway. Its own status says so; a status of another generation, or parts
    left out, does not."""
    snap = snapshot(example_docs("wireguard.yaml")[:1], secrets=frozenset())  # its private key, not opted in
    stored_gateway = dict(snap.gateway)
    d = run(snap, SETTINGS)
    refused = {**stored_gateway, "status": d.status}
    assert conditions(d)["ConfigRendered"]["status"] == "False"
    assert conditions(d)["ConfigRendered"]["observedGeneration"] == stored_gateway["metadata"]["generation"]
    assert refused_as_is(refused)
    assert not refused_as_is({**refused, "metadata": {**refused["metadata"], "generation": 4}})
    for reason in ("ServiceCIDRTaken", "TransitNetworkUnknown", "SecretsUnreadable"):  # nothing its own
        status = {"conditions": [{**c, "reason": reason} for c in refused["status"]["conditions"]]}
        assert not refused_as_is({**refused, "status": status}), reason
    fine = {**stored_gateway, "status": run(snapshot(example_docs("wireguard.yaml")[:1]), SETTINGS).status}
    assert not refused_as_is(fine) and not refused_as_is(stored_gateway)


@pytest.mark.parametrize(
    ("subnet", "what"),
    [
        ("0.0.0.0/0", "this-network"),
        ("169.254.169.254/32", "metadata service"),
        ("127.0.0.0/30", "loopback"),
        ("224.0.0.0/4", "multicast"),
        ("10.96.0.0/16", "API server's endpoint"),
    ],
)
def test_a_peer_routing_a_reserved_range_is_left_out_and_its_sibling_served(subnet: str, what: str) -> None:
    """Routed into a tunnel, the pod's own traffic (to the API server its agent reads the plan from, to
    the metadata service) would go to the peer: no peer may name such a range."""
    docs = edit(IPSEC, 2, ["spec", "ipsec", "remoteSubnets"], [subnet])  # s2
    settings = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        default_allowance=FABRIC,
        network_policy=NetworkPolicySettings(api_server=(("10.96.0.1/32", 443),)),
    )
    rendered = render_gateway(snapshot(docs), settings)
    assert rendered.plan is not None and rendered.plan.ipsec is not None
    assert [t.name for t in rendered.plan.ipsec.tunnels] == ["s1"]
    (problem,) = [p for p in rendered.problems if p.reason == "ReservedRange"]
    assert str(problem.item) == "peer s2" and problem.error.path == "spec.ipsec.remoteSubnets[0]"
    assert what in str(problem)


def test_an_unknown_transit_network_renders_nothing_new_and_keeps_what_is_deployed() -> None:
    """No serviceCIDR can be checked against a network the cloud cannot name yet (Neutron down at the
    controller's start): nothing new is rendered, the deployed plan stays."""
    rendered = render_gateway(snapshot(IPSEC), SETTINGS, None)
    assert rendered.plan is None and rendered.in_force is None
    assert [p.reason for p in rendered.problems] == ["TransitNetworkUnknown"]
    owned = applied(run(snapshot(IPSEC), SETTINGS))
    kept = render_gateway(snapshot(IPSEC, owned=owned), SETTINGS, None)
    assert kept.plan is None and kept.in_force is not None and kept.in_force.ipsec is not None
    assert [t.name for t in kept.in_force.ipsec.tunnels] == ["s1", "s2"]


# --- what a namespace may reach ------------------------------------------------------------------------


def test_an_exposure_outside_the_namespaces_allowance_is_left_out() -> None:
    outside = edit(IPSEC, 0, ["spec", "exposures", 1, "target", "address"], "10.0.0.5")  # db -> the cloud's
    rendered = render_gateway(snapshot(outside), SETTINGS)
    assert rendered.plan is not None
    assert [e.name for e in rendered.plan.nat.exposures] == ["web"]
    assert rendered.plan.nat.allowed_targets == ("192.0.2.64/26",), "for init-nat: a target by name"
    assert not any(g.exposure == "db" for g in rendered.plan.nat.grants)
    (problem, grant) = rendered.problems
    assert problem.reason == "ExposureTargetNotAllowed" and str(problem.item) == "exposure db"
    assert "is not inside the exposure targets the operator allows for namespace tenant-acme" in str(problem)
    assert grant.reason == "ExposureLeftOut"
    # A namespace of its own allowance: the same target is fine there.
    own = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        allowances={"tenant-acme": Allowance(exposure_targets=("10.0.0.0/24", "192.0.2.64/26"))},
    )
    assert render_gateway(snapshot(outside), own).problems == ()
    nothing = render_gateway(snapshot(IPSEC), Settings(internal_source_cidrs=("192.0.2.64/26",)))
    assert nothing.plan is not None and nothing.plan.nat.exposures == (), "the default allows no target"


def test_a_refused_gateway_keeps_nothing_the_operator_no_longer_allows() -> None:
    """Found by review: a tenant that keeps its gateway refused kept, in its deployed plan, the exposures,
    grants and reverse exposures the operator had since taken away (a narrowed allowance, no more
    internalSourceCIDRs): what the operator allows now holds for a kept plan too."""
    owned = applied(run(snapshot(IPSEC), SETTINGS))
    refused = edit(IPSEC, 0, ["spec", "serviceCIDR"], "198.18.0.0/33")
    assert "ConfigMap" not in written(run(snapshot(refused, owned=owned), SETTINGS)), "nothing taken away"
    only_web = Settings(
        internal_source_cidrs=("192.0.2.64/27",),
        default_allowance=Allowance(exposure_targets=("192.0.2.66/32",)),
    )
    d = run(snapshot(refused, owned=owned), only_web)
    assert conditions(d)["ConfigRendered"]["status"] == "False"
    kept = written_plan(d, owned)
    assert [e.name for e in kept.nat.exposures] == ["web"] and kept.nat.allowed_targets == ("192.0.2.66/32",)
    assert {g.exposure for g in kept.nat.grants} == {"web", "printer"}
    assert kept.nat.internal_source_cidrs == ("192.0.2.64/27",)
    assert {g.sources for g in kept.nat.grants if g.kind == "reverse"} == {("192.0.2.64/27",)}
    assert kept.ipsec is not None and [t.name for t in kept.ipsec.tunnels] == ["s1", "s2"]
    nothing = Settings(internal_source_cidrs=(), default_allowance=Allowance())
    bare = written_plan(run(snapshot(refused, owned=owned), nothing), owned)
    assert bare.nat.exposures == () and bare.nat.reverse_exposures == () and bare.nat.grants == ()


def test_a_refused_gateway_whose_service_cidr_is_no_longer_allowed_serves_no_peer() -> None:
    """Found by a second review: narrowing the namespace's serviceCIDRs allowance refused the gateway, but
    its kept plan went on serving the range with every tunnel and grant."""
    owned = applied(run(snapshot(IPSEC), SETTINGS))
    narrowed = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        default_allowance=Allowance(exposure_targets=("192.0.2.64/26",), service_cidrs=("198.19.0.0/16",)),
    )
    d = run(snapshot(IPSEC, owned=owned), narrowed)
    assert conditions(d)["ConfigRendered"]["reason"] == "ServiceCIDRNotAllowed"
    kept = written_plan(d, owned)
    assert kept.ipsec is not None and kept.ipsec.tunnels == () and kept.nat.grants == ()


def test_a_replaced_certificate_secret_takes_the_deployed_certificates_and_their_peers_along() -> None:
    """Found by a second review: a tenant replacing a leaked CA (certificateSecretRef to a new Secret)
    while its gateway was refused kept the old CA, key and the peers pinned to it."""
    from tests.unit.test_render_ca_pins import pubkey_documents

    docs = pubkey_documents()
    secrets = frozenset({"s1-psk", "acme-psk", "acme-tls", "acme-tls-2"})
    owned = applied(run(snapshot(docs, secrets=secrets), SETTINGS))
    refused = edit(docs, 0, ["spec", "serviceCIDR"], "198.18.0.0/33")
    same = written_plan(run(snapshot(refused, owned=owned, secrets=secrets), SETTINGS), owned)
    assert same.ipsec is not None and [t.name for t in same.ipsec.tunnels] == ["s1", "s2"]
    assert {c.ref.name for c in same.ipsec.certificates} == {"acme-tls"}
    replaced = edit(refused, 0, ["spec", "ipsec", "certificateSecretRef"], {"name": "acme-tls-2"})
    kept = written_plan(run(snapshot(replaced, owned=owned, secrets=secrets), SETTINGS), owned)
    assert kept.ipsec is not None
    assert kept.ipsec.certificates == () and kept.ipsec.private_keys == ()
    assert [t.name for t in kept.ipsec.tunnels] == ["s1"], "the PSK peer stays, the certificate peer goes"


def test_a_namespace_no_longer_enabled_serves_no_peer() -> None:
    """Found by review: the label taken off a served namespace left its tunnels and grants in force."""
    owned = applied(run(snapshot(IPSEC), SETTINGS))
    d = run(snapshot(IPSEC, owned=owned, namespace_enabled=False), SETTINGS)
    assert conditions(d)["ConfigRendered"]["reason"] == "NamespaceNotEnabled"
    kept = written_plan(d, owned)
    assert kept.ipsec is not None and kept.ipsec.tunnels == () and kept.ipsec.secrets == ()
    assert kept.nat.grants == ()


def test_an_exposure_target_on_the_api_servers_endpoint_is_left_out() -> None:
    """Found by review: a target is routed out through NIC2, the agent's own API traffic with it."""
    settings = Settings(
        internal_source_cidrs=("192.0.2.64/26",),
        default_allowance=FABRIC,
        network_policy=NetworkPolicySettings(api_server=(("192.0.2.67/32", 6443),)),
    )
    rendered = render_gateway(snapshot(IPSEC), settings)  # db's target is 192.0.2.67
    assert rendered.plan is not None and [e.name for e in rendered.plan.nat.exposures] == ["web"]
    (problem,) = [p for p in rendered.problems if str(p.item) == "exposure db"]
    assert problem.reason == "ReservedRange" and "the API server's endpoint" in str(problem)


def link(name: str, router: str, gateways: list[str], ns: str = "tenant-acme") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"routerID": router, "gateways": gateways}}


def test_a_cluster_link_naming_a_router_outside_the_allowance_programs_no_route() -> None:
    k = GatewayKey("VPNGateway", "tenant-acme", "acme")
    links = [
        link("ours", "r-ours", ["acme"]),
        link("theirs", "r-infra", ["acme"]),
        link("elsewhere", "r-x", ["acme"], ns="tenant-b"),  # another namespace's link never counts
        link("other-gw", "r-ours", ["other"]),
    ]
    got = cluster_links(k, links, allowed=("r-ours",))
    assert got == Links(routers=("r-ours",), refused=(("theirs", "r-infra"),))
    d = run(snapshot(IPSEC, links=got), SETTINGS)
    cond = conditions(d)["RoutingReady"]
    assert (cond["status"], cond["reason"]) == ("False", "RouterNotAllowed")
    assert "ClusterLink theirs (router r-infra)" in cond["message"]
    assert conditions(d)["Ready"]["status"] == "False"
    allowed_only = run(snapshot(IPSEC, links=cluster_links(k, links[:1], ("r-ours",))), SETTINGS)
    assert "RoutingReady" not in conditions(allowed_only), "the cloud's own RoutingReady is left alone"


def test_a_cluster_link_in_the_seeds_shape_naming_no_gateway_says_what_to_add() -> None:
    """The seed's ClusterLink had no spec.gateways (it carried every gateway's routes); this release routes
    only the gateways a link names, so such a link carries none, and RoutingReady says what to add."""
    k = GatewayKey("VPNGateway", "tenant-acme", "acme")
    seed_link = {"metadata": {"name": "old", "namespace": "tenant-acme"}, "spec": {"routerID": "r-ours"}}
    got = cluster_links(k, [seed_link, link("elsewhere", "r-x", [], ns="tenant-b")], allowed=("r-ours",))
    assert got == Links(unscoped=("old",))
    no_router = Condition("RoutingReady", False, "NoRouter", "1 virtual IP(s) paired, but no ClusterLink")
    cloud = dataclasses.replace(CLOUD, conditions=(*CLOUD.conditions, no_router))
    cond = conditions(run(snapshot(IPSEC, links=got), SETTINGS, cloud=cloud))["RoutingReady"]
    assert (cond["status"], cond["reason"]) == ("False", "ClusterLinkNamesNoGateways")
    assert "ClusterLink old names no gateways" in cond["message"] and "add acme to" in cond["message"]
    # Nothing to explain: the cloud found no router because there is no virtual IP, or a link names it.
    assert "RoutingReady" not in conditions(run(snapshot(IPSEC, links=got), SETTINGS))
    named = cluster_links(k, [seed_link, link("ours", "r-ours", ["acme"])], ("r-ours",))
    assert named.routers == ("r-ours",)
    assert conditions(run(snapshot(IPSEC, links=named), SETTINGS, cloud=cloud))["RoutingReady"]["reason"] == (
        "NoRouter"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"allowances": {"default": {"exposureTargets": ["10.0.0.0/33"]}}}, "default.exposureTargets[0]"),
        ({"allowances": {"namespaces": {"Bad_NS": {}}}}, "'Bad_NS' is not a namespace name"),
        ({"allowances": {"default": {"routers": []}}}, "unknown key(s) routers"),
        ({"allowances": {"default": {"clusterLinkRouters": ["a b"]}}}, "clusterLinkRouters[0]: 'a b'"),
        (
            {"allowances": {"default": {"serviceCIDRs": "10.0.0.0/8"}}},
            "default.serviceCIDRs: expected a list",
        ),
        ({"allowances": {"namespaces": {"t": {"serviceCIDRs": ["10.0.0.0/40"]}}}}, "t.serviceCIDRs[0]"),
        (
            {"gatewayPod": {"imagePullSecrets": [{"name": "Reg_Cred"}]}},
            "config.gatewayPod.imagePullSecrets[0]: 'Reg_Cred' is not a Secret name",
        ),
        ({"gatewayPod": {"imagePullSecrets": "regcred"}}, "imagePullSecrets: expected a list"),
    ],
)
def test_allowances_in_the_config_are_checked_naming_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        from_config(config)


def test_allowances_parse_per_namespace_over_a_default() -> None:
    s = from_config(
        {
            "allowances": {
                "default": {"exposureTargets": ["10.1.0.0/24"]},
                "namespaces": {
                    "tenant-acme": {"exposureTargets": ["10.2.0.0/24"], "clusterLinkRouters": ["r1"]}
                },
            }
        }
    )
    assert s.allowance("tenant-acme") == Allowance(("10.2.0.0/24",), ("r1",))
    assert s.allowance("tenant-b") == Allowance(("10.1.0.0/24",), ())
    assert Settings().allowance("anyone") == Allowance(), "nothing unless the operator says so"
