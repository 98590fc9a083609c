"""The generated CRDs follow the API server's rules for CRD documents (no API server here to ask):
structural schemas, list semantics, CEL rule reasons and field paths, printer columns, defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml

from controller.api.crds import crds, crds_yaml

REASONS = {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
CRDS = crds()


def nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{key}")
    if "items" in schema:
        yield from nodes(schema["items"], f"{path}[]")


def schema(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("crd", CRDS, ids=lambda c: c["metadata"]["name"])
def test_schema_is_structural(crd: Mapping[str, Any]) -> None:
    root = schema(crd)
    assert root["properties"]["metadata"] == {"type": "object"}, "ObjectMeta may not be described further"
    for path, node in nodes(root):
        assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        assert "additionalProperties" not in node or "properties" not in node, path
        if node.get("type") == "array":
            assert "items" in node, path
            kind = node["x-kubernetes-list-type"]
            if kind == "set":
                assert node["items"]["type"] in {"string", "integer", "boolean"}, path
            if kind == "map":
                item = node["items"]
                for key in node["x-kubernetes-list-map-keys"]:
                    assert key in item.get("required", []) or "default" in item["properties"][key], path
        if "default" in node:
            assert node["default"] in node.get("enum", [node["default"]]), path


@pytest.mark.parametrize("crd", CRDS, ids=lambda c: c["metadata"]["name"])
def test_cel_rules_have_valid_reasons_messages_and_field_paths(crd: Mapping[str, Any]) -> None:
    seen = 0
    for path, node in nodes(schema(crd)):
        for rule in node.get("x-kubernetes-validations", []):
            seen += 1
            assert rule["reason"] in REASONS, (path, rule)
            assert rule["message"] and "\n" not in rule["message"]
            if "fieldPath" in rule:
                target: Mapping[str, Any] = node
                for part in rule["fieldPath"].strip(".").split("."):
                    assert part in target.get("properties", {}), (path, rule["fieldPath"])
                    target = target["properties"][part]
    assert seen >= 1, "at least the root metadata.name rule"


def test_names_versions_and_subresources() -> None:
    names = {c["spec"]["names"]["kind"]: c for c in CRDS}
    assert set(names) == {"VPNGateway", "VPNPeer", "IPsecGateway", "ClusterLink"}
    for kind, crd in names.items():
        spec = crd["spec"]
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
        assert spec["scope"] == "Namespaced" and spec["names"]["listKind"] == f"{kind}List"
        (version,) = spec["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        # Structural: an undeclared status field would be pruned (tests/status_schema.py lists the writers').
        assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(schema(crd)["properties"]["status"])
    assert {names["VPNGateway"]["spec"]["group"], names["IPsecGateway"]["spec"]["group"]} == {
        "vpn.bnerd.net",
        "ipsec.bnerd.net",
    }


def test_yaml_round_trips() -> None:
    assert list(yaml.safe_load_all(crds_yaml())) == CRDS
