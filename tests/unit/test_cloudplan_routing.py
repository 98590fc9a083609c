"""RoutingReady (OpenStack): never True while a virtual IP has no router carrying it; what may be adopted."""

from __future__ import annotations

from controller.cloudplan import (
    CloudPlan,
    adoption_refusal,
    cluster_tag,
    foreign_cluster,
    gateway_of,
    routing_condition,
    sweepable,
    tags,
)
from controller.names import GatewayKey


def test_no_reverse_exposure_needs_no_route() -> None:
    cond = routing_condition(CloudPlan(frozenset(), (), (), ()), True)
    assert (cond.status, cond.reason) == (True, "NoReverseExposures")


def test_virtual_ips_without_a_router_are_not_ready_and_say_what_to_add() -> None:
    cond = routing_condition(CloudPlan(frozenset(), ("198.18.0.5",), (), ()), True)
    assert (cond.status, cond.reason) == (False, "NoRouter")
    assert "spec.gateways" in cond.message


def test_virtual_ips_on_a_router_are_ready_and_a_failure_is_not() -> None:
    cp = CloudPlan(frozenset(), ("198.18.0.5",), ("r1",), ())
    assert routing_condition(cp, True).status
    failed = routing_condition(cp, False, "Routes: refused")
    assert (failed.status, failed.reason, failed.message) == (False, "RoutesPending", "Routes: refused")


def test_adoption_refuses_what_another_gateway_or_installation_tagged_and_takes_the_rest() -> None:
    key = GatewayKey("VPNGateway", "tenant-acme", "acme")
    assert adoption_refusal("port p", ["bnerd-vpn-operator"], key, "vpngw") is None
    assert adoption_refusal("port p", list(tags(key, "vpngw")), key, "vpngw") is None, "ours already"
    other = adoption_refusal("port p", list(tags(GatewayKey("VPNGateway", "t", "b"), "vpngw")), key, "vpngw")
    assert other == (
        "port p is tagged vpngw-gateway:VPNGateway.t.b: "
        "it belongs to another gateway, installation or cluster"
    )
    elsewhere = adoption_refusal("port p", list(tags(key, "prod")), key, "vpngw")
    assert elsewhere is not None and "vpngw-instance:prod" in elsewhere


def test_the_gateway_a_resource_is_tagged_for_and_what_may_be_swept() -> None:
    key = GatewayKey("VPNGateway", "tenant-acme", "acme")
    legacy = GatewayKey("IPsecGateway", "t", "old.one")
    assert gateway_of([*tags(key, "vpngw"), cluster_tag("c")]) == key
    assert gateway_of(tags(legacy, "vpngw")) == legacy, "a name with a dot"
    assert gateway_of(["vpngw-gateway:Pod.t.x"]) is None and gateway_of(["other"]) is None
    held = {
        key: "2026-12-03T06:00:00Z",
        legacy: "2026-12-03T06:10:00Z",
        GatewayKey("VPNGateway", "t", "n"): "",
    }
    unknown = GatewayKey("VPNGateway", "elsewhere", "x")
    held[unknown] = "2026-12-03T05:00:00Z"
    answers = {key: False, legacy: False, unknown: None}
    assert sweepable(held, answers.get, "2026-12-03T06:05:00Z") == (key,), (
        "the younger one waits out its grace"
    )
    assert sweepable(held, answers.get, "2026-12-03T07:00:00Z") == (legacy, key)
    assert sweepable(held, {key: True, legacy: True}.get, "2026-12-03T07:00:00Z") == (), "they exist"


def test_another_clusters_resources_are_foreign_even_with_our_instance_and_gateway_tags() -> None:
    key = GatewayKey("VPNGateway", "tenant-acme", "acme")
    theirs = [*tags(key, "vpngw"), cluster_tag("b")]
    assert foreign_cluster(theirs, "a") and foreign_cluster(theirs, None)
    assert not foreign_cluster([*tags(key, "vpngw"), cluster_tag("a")], "a")
    assert not foreign_cluster(tags(key, "vpngw"), "a"), "made before the cluster tag: ours to tag"
    refused = adoption_refusal("port p", theirs, key, "vpngw", "a")
    assert refused is not None and "vpngw-cluster:b" in refused
