"""The sweep's pure half: which gateway a resource's tags name, and which gateways' cloud resources go."""

from __future__ import annotations

from controller.cloud import sweepable
from controller.cloudplan import key_of_tags, tags
from controller.names import GatewayKey

ACME = GatewayKey("VPNGateway", "tenant-acme", "acme")
DOTTED = GatewayKey("IPsecGateway", "tenant-b", "hq.example.com")


def test_the_tags_name_their_gateway_back_also_with_dots_in_its_name() -> None:
    for key in (ACME, DOTTED):
        assert key_of_tags(tags(key, "vpngw")) == key
        assert key_of_tags(["someone-elses", *reversed(tags(key, "other"))]) == key


def test_tags_that_name_no_gateway_are_none() -> None:
    assert key_of_tags([]) is None
    assert key_of_tags(["vpngw-instance:vpngw"]) is None
    assert key_of_tags(["vpngw-gateway:Pod.ns.name"]) is None  # not a gateway kind
    assert key_of_tags(["vpngw-gateway:VPNGateway.ns"]) is None  # no name
    assert key_of_tags(["vpngw-gateway:VPNGateway..name"]) is None  # no namespace


def test_only_a_gateway_gone_and_untouched_for_the_grace_is_swept() -> None:
    gone_long_ago = GatewayKey("VPNGateway", "tenant-acme", "old")
    gone_just_now = GatewayKey("VPNGateway", "tenant-acme", "new")
    owned = {ACME: 0.0, gone_long_ago: 100.0, gone_just_now: 950.0}
    assert sweepable(owned, {ACME}, now=1000.0, grace=300.0) == [gone_long_ago]
    # grace 0: all of a gateway gone, at once
    assert sweepable(owned, {ACME}, now=1000.0, grace=0.0) == [gone_just_now, gone_long_ago]
    # the gateway exists: never, however old its resources
    assert sweepable(owned, {ACME, gone_long_ago, gone_just_now}, now=1e9, grace=0.0) == []


def test_a_controller_watching_one_namespace_sweeps_only_there() -> None:
    other = GatewayKey("VPNGateway", "tenant-other", "x")
    owned = {other: 0.0, GatewayKey("VPNGateway", "tenant-acme", "y"): 0.0}
    assert sweepable(owned, set(), now=1000.0, grace=0.0, namespace="tenant-acme") == [
        GatewayKey("VPNGateway", "tenant-acme", "y")
    ]
