"""Custom resource admission in the emulator: the project's CRD schemas and CEL rules, 422 bodies worded as
apiextensions-apiserver words them, schema defaults, unknown-field pruning and fieldValidation."""

from __future__ import annotations

import copy
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.api.crds import crds
from lab.kubeapi import KubeAPI

pytestmark = pytest.mark.anyio
PATH = "/apis/vpn.bnerd.net/v1alpha1/namespaces/default/vpngateways"
WG = {
    "listenPort": 51820,
    "address": "10.99.0.1/24",
    "privateKeySecretRef": {"name": "gw-wg", "key": "privateKey"},
}
BASE: dict[str, Any] = {
    "apiVersion": "vpn.bnerd.net/v1alpha1",
    "kind": "VPNGateway",
    "metadata": {"name": "gw"},
    "spec": {"type": "wireguard", "serviceCIDR": "198.18.0.0/24", "wireguard": WG},
}
EXPOSURE = {"name": "web", "target": {"address": "192.0.2.1"}, "ports": [{"port": 80}]}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with KubeAPI(kubeconfig=tmp_path / "kc") as api:
        ctx = ssl.create_default_context(cafile=str(api.ca_file))
        async with httpx.AsyncClient(
            base_url=api.url, verify=ctx, headers={"Authorization": f"Bearer {api.admin_token}"}
        ) as c:
            for crd in crds():
                assert (
                    await c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
                ).status_code == 201
            yield c


def _with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    change(obj["spec"])
    return obj


CASES = [
    pytest.param(
        lambda s: s.update(type="gre"),
        'spec.type: Unsupported value: "gre": supported values: "ipsec", "wireguard"',
        id="enum",
    ),
    pytest.param(lambda s: s.pop("serviceCIDR"), "spec.serviceCIDR: Required value", id="required"),
    pytest.param(
        lambda s: s["wireguard"].update(listenPort=0),
        "spec.wireguard.listenPort: Invalid value: 0: spec.wireguard.listenPort in body should be "
        "greater than or equal to 1",
        id="minimum",
    ),
    pytest.param(
        lambda s: s["wireguard"].update(listenPort="x"),
        'spec.wireguard.listenPort: Invalid value: "string": spec.wireguard.listenPort in body must '
        'be of type integer: "string"',
        id="type",
    ),
    pytest.param(
        lambda s: s.update(serviceCIDR="198.18.0.0/7"),
        'spec.serviceCIDR: Invalid value: "198.18.0.0/7": spec.serviceCIDR in body should match',
        id="pattern-re2",
    ),
    pytest.param(
        lambda s: s.update(exposures=[{**EXPOSURE, "target": {"address": "192.0.2.1", "host": "h"}}]),
        'spec.exposures[0].target: Invalid value: "object": exactly one of address or host must be set',
        id="cel-rule",
    ),
    pytest.param(
        lambda s: s.update(exposures=[{**EXPOSURE, "target": {"address": "127.0.0.1"}}]),
        'spec.exposures[0].target.address: Invalid value: "string": is a special-purpose address',
        id="cel-matches",
    ),
    pytest.param(
        lambda s: s.update(exposures=[EXPOSURE, EXPOSURE]),
        'spec.exposures[1]: Duplicate value: map[string]interface {}{"name":"web"}',
        id="list-map-keys",
    ),
    pytest.param(
        lambda s: s.pop("wireguard"),
        "spec.wireguard: Required value: is required when type is wireguard",
        id="cel-required",
    ),
]


@pytest.mark.parametrize("change, message", CASES)
async def test_invalid_custom_resources_are_422_in_kubernetes_wording(
    http: httpx.AsyncClient, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    r = await http.post(PATH, json=_with(change))
    body = r.json()
    assert r.status_code == 422 and body["reason"] == "Invalid", body
    assert body["message"].startswith('VPNGateway.vpn.bnerd.net "gw" is invalid: ')
    assert message in body["message"]
    assert body["details"]["kind"] == "VPNGateway" and body["details"]["causes"]


async def test_schema_defaults_are_applied(http: httpx.AsyncClient) -> None:
    r = await http.post(PATH, json=_with(lambda s: s.update(exposures=[EXPOSURE])))
    assert r.status_code == 201
    assert r.json()["spec"]["exposures"][0]["ports"] == [{"port": 80, "protocol": "TCP"}]


async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    http: httpx.AsyncClient,
) -> None:
    r = await http.post(PATH, json=_with(lambda s: s.update(bogus=1)))
    assert r.status_code == 201 and "bogus" not in r.json()["spec"]
    assert r.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    strict = _with(lambda s: s.update(bogus=1))
    strict["metadata"]["name"] = "strict"
    r = await http.post(PATH + "?fieldValidation=Strict", json=strict)
    assert r.status_code == 400
    assert (
        r.json()["message"]
        == 'VPNGateway in version "v1alpha1" cannot be handled as a VPNGateway: strict decoding error: '
        'unknown field "spec.bogus"'
    )


async def test_updates_are_validated_too(http: httpx.AsyncClient) -> None:
    assert (await http.post(PATH, json=BASE)).status_code == 201
    r = await http.patch(
        f"{PATH}/gw",
        content=json.dumps({"spec": {"type": "gre"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 422 and "Unsupported value" in r.json()["message"]
    r = await http.patch(
        f"{PATH}/gw/status",
        content=json.dumps({"status": {"nodeName": "n1"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200 and r.json()["status"]["nodeName"] == "n1"


async def test_a_status_write_is_pruned_to_the_structural_status_schema(http: httpx.AsyncClient) -> None:
    """As apiextensions-apiserver prunes (pkg/apiserver/schema/pruning): an undeclared status field, at the
    top or inside a list item, is dropped with a warning; a null of a non-nullable field is dropped; the
    rest is kept. So a status field missing from the CRD fails tests/component/test_status_schema.py."""
    assert (await http.post(PATH, json=BASE)).status_code == 201
    status = {
        "nodeName": "n1",
        "bogus": 1,
        "tunnels": [{"name": "hq", "state": "Down", "establishedAt": None, "extra": {"x": 1}}],
        "conditions": [{"type": "Ready", "status": "True", "extra": "x"}],
    }
    r = await http.patch(
        f"{PATH}/gw/status",
        content=json.dumps({"status": status}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.json()
    assert r.json()["status"] == {
        "nodeName": "n1",
        "tunnels": [{"name": "hq", "state": "Down"}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    assert 'unknown field \\"status.bogus\\"' in r.headers["Warning"]
    assert 'unknown field \\"status.tunnels[0].extra\\"' in r.headers["Warning"]
