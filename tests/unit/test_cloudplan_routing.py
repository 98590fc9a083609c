"""RoutingReady (OpenStack): never True while a virtual IP has no router carrying it."""

from __future__ import annotations

from controller.cloudplan import CloudPlan, routing_condition


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
