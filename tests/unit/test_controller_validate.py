# ruff: noqa: E501  (the table holds exact user-facing error lines)
"""Cross-object rules (a gateway, its peers and the operator's options): the ones no admission schema
can express. Pure, table-driven; per-object rules are covered by tests/component/test_crd_*.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.api.model import parse
from controller.api.validate import REVERSE_NEEDS_INTERNAL, InvalidInput, Problem, admit, validate
from controller.plan.render import RenderOptions, render_documents
from tests.examples import edit, example_docs

INTERNAL = ("192.0.2.64/26",)


def problems(documents: list[dict[str, Any]], internal: tuple[str, ...] = INTERNAL) -> list[Problem]:
    try:
        render_documents(documents, RenderOptions(internal_source_cidrs=internal))
    except InvalidInput as exc:
        return list(exc.problems)
    return []


@pytest.mark.parametrize("name", ["ipsec.yaml", "wireguard.yaml", "legacy-ipsecgateway.yaml"])
def test_examples_render_cleanly(name: str) -> None:
    assert problems(example_docs(name)) == []


IPSEC = example_docs("ipsec.yaml")
WG = example_docs("wireguard.yaml")
LEGACY = example_docs("legacy-ipsecgateway.yaml")


@pytest.mark.parametrize(
    "documents, internal, line, reason",
    [
        pytest.param(
            edit(IPSEC, 1, ["spec", "authorization", "exposures"], ["web", "nope"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s1: spec.authorization.exposures[1]: "nope" names no exposure of '
            "VPNGateway/tenant-acme/acme",
            "UnknownExposure",
            id="grant-unknown-exposure",
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "authorization", "reverseExposures"], ["web"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.authorization.reverseExposures[0]: "web" names no reverse exposure',
            "UnknownExposure",
            id="grant-exposure-as-reverse",
        ),
        pytest.param(
            IPSEC,
            (),
            'VPNGateway/tenant-acme/acme: spec.reverseExposures[0]: "printer" needs the operator\'s internalSourceCIDRs',
            REVERSE_NEEDS_INTERNAL,
            id="reverse-without-internal-cidrs",
        ),
        pytest.param(
            LEGACY,
            (),
            'IPsecGateway/tenant-old/legacy: spec.reverseExposures[0]: "printer" needs the operator\'s internalSourceCIDRs',
            REVERSE_NEEDS_INTERNAL,
            id="legacy-reverse-without-internal-cidrs",
        ),
        pytest.param(
            IPSEC,
            ("203.0.0.0/16",),
            'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[0]: "203.0.113.0/28" overlaps the operator\'s '
            "internalSourceCIDRs entry 203.0.0.0/16",
            "InternalSourceCIDRsOverlapPeer",
            id="internal-cidrs-overlap-peer",
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "ipsec", "remoteSubnets"], ["203.0.113.8/29"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.ipsec.remoteSubnets[0]: "203.0.113.8/29" overlaps VPNPeer/tenant-acme/s1 '
            'spec.ipsec.remoteSubnets[0] "203.0.113.0/28"',
            "SubnetsOverlap",
            id="subnets-overlap-across-peers",
        ),
        pytest.param(
            edit(IPSEC, 1, ["spec", "ipsec", "remoteSubnets"], ["10.0.0.0/8", "10.1.0.0/16"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[1]: "10.1.0.0/16" overlaps spec.ipsec.remoteSubnets[0]',
            "SubnetsOverlap",
            id="subnets-overlap-within-peer",
        ),
        pytest.param(
            edit(WG, 2, ["spec", "wireguard", "allowedIPs"], ["10.99.0.2/32"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s1: spec.wireguard.allowedIPs[0]: "10.99.0.2/32" overlaps VPNPeer/tenant-acme/laptop',
            "SubnetsOverlap",
            id="wireguard-allowed-ips-overlap",
        ),
        pytest.param(
            edit(IPSEC, 1, ["spec", "ipsec", "remoteSubnets"], ["198.18.0.128/25"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[0]: "198.18.0.128/25" overlaps the gateway\'s '
            "serviceCIDR",
            "OverlapsServiceCIDR",
            id="subnet-overlaps-service-cidr",
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "ipsec", "id"], "s1.lab.example"),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.ipsec.id: "s1.lab.example" is already the IKE id of VPNPeer/tenant-acme/s1',
            "FieldValueDuplicate",
            id="duplicate-ike-id",
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "ipsec", "id"], "S1.Lab.Example"),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.ipsec.id: "S1.Lab.Example" is already the IKE id of VPNPeer/tenant-acme/s1',
            "FieldValueDuplicate",
            id="duplicate-ike-id-differs-only-in-case",  # charon compares FQDN ids case-insensitively
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "ipsec", "id"], "GW.lab.example"),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.ipsec.id: "GW.lab.example" is the gateway\'s own IKE id',
            "FieldValueDuplicate",
            id="peer-id-is-the-gateways-own",  # its key would be owned by the id of every exchange
        ),
        pytest.param(
            edit(LEGACY, 0, ["spec", "tunnels", 1, "peer", "id"], "gw.lab.example"),
            INTERNAL,
            'IPsecGateway/tenant-old/legacy: spec.tunnels[1].peer.id: "gw.lab.example" is the gateway\'s own IKE id',
            "FieldValueDuplicate",
            id="legacy-peer-id-is-the-gateways-own",
        ),
        pytest.param(
            edit(WG, 2, ["spec", "wireguard", "publicKey"], WG[1]["spec"]["wireguard"]["publicKey"]),
            INTERNAL,
            "VPNPeer/tenant-acme/s1: spec.wireguard.publicKey: is already the public key of "
            "VPNPeer/tenant-acme/laptop",
            "FieldValueDuplicate",
            id="duplicate-public-key",
        ),
        pytest.param(
            edit(IPSEC, 1, ["spec", "gatewayRef", "name"], "other"),
            INTERNAL,
            'VPNPeer/tenant-acme/s1: spec.gatewayRef.name: "other" does not name the gateway being rendered',
            "GatewayMismatch",
            id="peer-of-another-gateway",
        ),
        pytest.param(
            [IPSEC[0], WG[1]],
            INTERNAL,
            "VPNPeer/tenant-acme/s1: spec.ipsec: is required: VPNGateway/tenant-acme/acme is an ipsec gateway",
            "FieldValueRequired",
            id="wireguard-peer-on-ipsec-gateway",
        ),
        pytest.param(
            [edit(IPSEC, 0, ["spec", "ipsec"], {"localID": "gw.lab.example"})[0], IPSEC[2]],
            INTERNAL,
            "VPNPeer/tenant-acme/s2: spec.ipsec.pskSecretRef: is required: VPNGateway/tenant-acme/acme has no "
            "default",
            "FieldValueRequired",
            id="psk-peer-without-any-psk",
        ),
        pytest.param(
            edit(
                IPSEC,
                2,
                ["spec", "ipsec"],
                {"id": "s2.lab.example", "auth": "pubkey", "remoteSubnets": ["203.0.113.16/28"]},
            ),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.ipsec.auth: "pubkey" needs a gateway certificate',
            "FieldValueRequired",
            id="pubkey-peer-without-gateway-certificate",
        ),
        pytest.param(
            edit(IPSEC, 2, ["spec", "authorization", "reverseExposures"], ["printer"]),
            INTERNAL,
            'VPNPeer/tenant-acme/s2: spec.authorization.reverseExposures[0]: "printer" targets 203.0.113.1, which is '
            "not inside this peer's subnets",
            "ReverseTargetOutsidePeer",
            id="reverse-grant-to-a-peer-not-holding-the-target",
        ),
        pytest.param(
            edit(LEGACY, 0, ["spec", "reverseExposures", 0, "target", "address"], "10.9.9.9"),
            INTERNAL,
            'IPsecGateway/tenant-old/legacy: spec.reverseExposures[0].target.address: "10.9.9.9" is not inside any '
            "tunnel's remoteSubnets",
            "ReverseTargetOutsidePeer",
            id="legacy-reverse-target-outside-tunnels",
        ),
        pytest.param(
            edit(LEGACY, 0, ["spec", "tunnels", 1, "peer", "id"], "s1.lab.example"),
            INTERNAL,
            'IPsecGateway/tenant-old/legacy: spec.tunnels[1].peer.id: "s1.lab.example" is already the IKE id of '
            "spec.tunnels[0]",
            "FieldValueDuplicate",
            id="legacy-duplicate-peer-id",
        ),
        pytest.param(
            edit(LEGACY, 0, ["spec", "tunnels", 1, "peer", "id"], "S1.LAB.EXAMPLE"),
            INTERNAL,
            'IPsecGateway/tenant-old/legacy: spec.tunnels[1].peer.id: "S1.LAB.EXAMPLE" is already the IKE id of '
            "spec.tunnels[0]",
            "FieldValueDuplicate",
            id="legacy-duplicate-peer-id-differs-only-in-case",
        ),
        pytest.param(
            IPSEC,
            ("192.0.2.64/33",),
            'operator: internalSourceCIDRs[0]: "192.0.2.64/33" is not an IPv4 CIDR',
            "FieldValueInvalid",
            id="bad-internal-cidr",
        ),
        pytest.param(
            [IPSEC[0], LEGACY[0]],
            INTERNAL,
            "input: (documents): must contain exactly one VPNGateway or IPsecGateway",
            "FieldValueInvalid",
            id="two-gateways",
        ),
        pytest.param(
            [*LEGACY, IPSEC[1]],
            INTERNAL,
            "VPNPeer/tenant-acme/s1: kind: VPNPeers belong to VPNGateways",
            "FieldValueInvalid",
            id="peer-with-legacy-gateway",
        ),
    ],
)
def test_cross_object_rules(
    documents: list[dict[str, Any]], internal: tuple[str, ...], line: str, reason: str
) -> None:
    found = problems(documents, internal)
    matching = [p for p in found if str(p).startswith(line)]
    assert matching, [str(p) for p in found]
    assert matching[0].reason == reason


def test_every_problem_is_reported_not_just_the_first() -> None:
    bad = edit(IPSEC, 1, ["spec", "authorization", "exposures"], ["nope1", "nope2"])
    bad = edit(bad, 2, ["spec", "ipsec", "id"], "s1.lab.example")
    found = [str(p) for p in problems(bad)]
    assert len(found) == 3, found


def test_per_object_problems_of_every_document_are_reported_together() -> None:
    bad = edit(IPSEC, 1, ["spec", "ipsec", "remoteSubnets", 1], "192.168.20.0/33")
    bad = edit(bad, 0, ["spec", "ipsec", "pskSecretRef", "key"], "..")
    found = [str(p) for p in problems(bad)]
    assert (
        'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[1]: "192.168.20.0/33" is not an IPv4 CIDR' in found
    )
    assert any(
        p.startswith('VPNGateway/tenant-acme/acme: spec.ipsec.pskSecretRef.key: ".." is not a Secret key')
        for p in found
    ), found


def test_overlap_check_scales_to_thousands_of_subnets() -> None:
    gateway = parse(IPSEC[0])
    peer = IPSEC[1]
    many = []
    for i in range(3000):
        doc = copy.deepcopy(peer)
        doc["metadata"]["name"] = f"p{i}"
        doc["spec"]["ipsec"]["id"] = f"p{i}.example"
        doc["spec"]["ipsec"]["remoteSubnets"] = [f"10.{i // 256}.{i % 256}.0/24"]
        doc["spec"]["authorization"] = {}
        many.append(doc)
    many[-1]["spec"]["ipsec"]["remoteSubnets"] = ["10.0.5.128/25"]  # inside p5's /24
    found = problems([IPSEC[0], *many])
    # Conflicts go to the first in the operator's order (deployed, then by name): "p2999" < "p5".
    assert [p.resource for p in found] == ["VPNPeer/tenant-acme/p5"]
    assert gateway.meta.name == "acme"


def test_validate_reports_per_object_then_cross_object_problems() -> None:
    assert validate(IPSEC, INTERNAL) == []
    per_object = validate(edit(IPSEC, 1, ["spec", "endpoint"], "not a host"), INTERNAL)
    assert [p.error.path for p in per_object] == ["spec.endpoint"]
    cross = validate(IPSEC, ())
    # The reverse exposure is left out, and so is the grant naming it.
    assert [p.reason for p in cross] == [REVERSE_NEEDS_INTERNAL, "ExposureLeftOut"]


def test_wireguard_tunnel_address_must_not_overlap_the_service_cidr() -> None:
    found = validate(edit(WG, 0, ["spec", "wireguard", "address"], "198.18.0.200/24"), INTERNAL)
    assert [str(p) for p in found] == [
        'VPNGateway/tenant-acme/acme-wg: spec.wireguard.address: "198.18.0.200/24" overlaps the gateway\'s '
        "serviceCIDR 198.18.0.0/24"
    ]


def test_service_cidr_must_not_hold_exposure_targets_or_internal_sources() -> None:
    target = validate(edit(IPSEC, 0, ["spec", "exposures", 0, "target", "address"], "198.18.0.9"), INTERNAL)
    assert [str(p) for p in target] == [
        'VPNGateway/tenant-acme/acme: spec.exposures[0].target.address: "198.18.0.9" is inside the gateway\'s '
        "serviceCIDR: a target must be a fabric address",
        'VPNPeer/tenant-acme/s1: spec.authorization.exposures[0]: "web" names an exposure of '
        "VPNGateway/tenant-acme/acme that is left out",
        'VPNPeer/tenant-acme/s2: spec.authorization.exposures[0]: "web" names an exposure of '
        "VPNGateway/tenant-acme/acme that is left out",
    ]
    (internal,) = validate(_without_reverse(IPSEC), ("198.18.0.0/16",))
    assert str(internal).startswith(
        'VPNGateway/tenant-acme/acme: spec.serviceCIDR: "198.18.0.0/24" overlaps the operator\'s '
        "internalSourceCIDRs entry 198.18.0.0/16"
    )


def _without_reverse(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = edit(documents, 0, ["spec", "reverseExposures"], [])
    return edit(out, 1, ["spec", "authorization", "reverseExposures"], [])


def test_internal_source_cidrs_must_be_disjoint_from_peers_only_when_reverse_exposures_use_them() -> None:
    """internalSourceCIDRs are the sources of reverse grants: an operator-wide fabric range overlapping a
    tenant's subnets matters only on a gateway with reverse exposures. A serviceCIDR inside them matters
    always: its SNAT source would pass for a fabric source at every other gateway's reverse exposures."""
    overlapping = ("203.0.0.0/16", "198.18.0.0/16")  # s1's 203.0.113.0/28 and the serviceCIDR
    with_reverse = [str(p) for p in validate(IPSEC, overlapping)]
    assert with_reverse == [
        'VPNGateway/tenant-acme/acme: spec.serviceCIDR: "198.18.0.0/24" overlaps the operator\'s '
        "internalSourceCIDRs entry 198.18.0.0/16: traffic from its virtual IPs (the source of its reverse "
        "exposures' SNAT) would pass for fabric sources at every gateway's reverse exposures",
        'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[0]: "203.0.113.0/28" overlaps the operator\'s '
        "internalSourceCIDRs entry 203.0.0.0/16: the gateway has reverse exposures, whose grants admit "
        "every internal source, so this peer's own addresses would reach them",
        'VPNPeer/tenant-acme/s2: spec.ipsec.remoteSubnets[0]: "203.0.113.16/28" overlaps the operator\'s '
        "internalSourceCIDRs entry 203.0.0.0/16: the gateway has reverse exposures, whose grants admit "
        "every internal source, so this peer's own addresses would reach them",
    ]
    assert [p.reason for p in validate(_without_reverse(IPSEC), overlapping)] == ["OverlapsServiceCIDR"]
    assert validate(_without_reverse(IPSEC), ("203.0.0.0/16",)) == []
    assert validate(WG, ("10.99.0.0/16",)) == [], "no reverse exposures: allowedIPs may overlap them"
    assert validate(_without_reverse(IPSEC), ("10.0.0.0/33",))[0].reason == "FieldValueInvalid", (
        "a malformed flag is still an error"
    )


def test_nulls_are_pruned_from_a_copy_and_a_document_without_nulls_is_kept_as_is() -> None:
    peer = edit(WG, 2, ["spec", "wireguard", "endpointPort"], None)[2]
    peer["spec"]["authorization"]["exposures"] = [None]  # a null list item is kept (and rejected)
    before = copy.deepcopy(peer)
    found, stored = admit(peer)
    assert peer == before, "the input is not modified"
    assert "endpointPort" not in stored["spec"]["wireguard"]
    assert stored["spec"]["authorization"]["exposures"] == [None]
    assert [str(p) for p in found] == [
        "VPNPeer/tenant-acme/laptop: spec.authorization.exposures[0]: must be a string (got null)"
    ]
    assert admit(WG[0])[1] is WG[0]
