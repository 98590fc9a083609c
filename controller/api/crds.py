"""CustomResourceDefinitions generated from ``controller.api.resources`` (the same source ``validate`` reads).

``python -m controller crds`` prints them as multi-document YAML (``kubectl apply -f -`` or the chart's
crds/ directory). Pure: returns data and text.
"""

from __future__ import annotations

from typing import Any

import yaml

from controller.api.resources import RESOURCES, VERSION, Resource
from controller.api.schema import openapi

_PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "VPNGateway": [
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {"name": "Node", "type": "string", "jsonPath": ".status.nodeName"},
        {"name": "Public IP", "type": "string", "jsonPath": ".status.publicIP"},
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    ],
    "VPNPeer": [
        {"name": "Gateway", "type": "string", "jsonPath": ".spec.gatewayRef.name"},
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".spec.endpoint"},
    ],
    "IPsecGateway": [
        {"name": "Node", "type": "string", "jsonPath": ".status.nodeName"},
        {"name": "Public IP", "type": "string", "jsonPath": ".status.publicIP"},
    ],
    "ClusterLink": [{"name": "Router", "type": "string", "jsonPath": ".spec.routerID"}],
}


def schema_of(resource: Resource) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one resource."""
    schema = openapi(resource.root)
    # A CRD may not describe metadata beyond its type (the API server validates ObjectMeta itself);
    # metadata.name is constrained by the root CEL rule instead.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def crd(resource: Resource) -> dict[str, Any]:
    singular = resource.kind.lower()
    columns = [
        *_PRINTER_COLUMNS.get(resource.kind, []),
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{resource.group}"},
        "spec": {
            "group": resource.group,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": singular,
                "shortNames": list(resource.short_names),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema_of(resource)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crds() -> list[dict[str, Any]]:
    return [crd(r) for r in RESOURCES]


def crds_yaml() -> str:
    return yaml.safe_dump_all(crds(), sort_keys=False, default_flow_style=False, width=120)
