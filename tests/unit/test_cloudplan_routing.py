"""RoutingReady (OpenStack): never True while a virtual IP has no router carrying it; what may be adopted."""

from __future__ import annotations

from controller.cloudplan import CloudPlan, adoption_refusal, routing_condition, tags
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
    assert (
        other
        == "port p is tagged vpngw-gateway:VPNGateway.t.b: it belongs to another gateway or installation"
    )
    elsewhere = adoption_refusal("port p", list(tags(key, "prod")), key, "vpngw")
    assert elsewhere is not None and "vpngw-instance:prod" in elsewhere
