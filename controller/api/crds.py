"""CustomResourceDefinitions generated from ``controller.api.resources`` (the same source ``validate`` reads).

``python -m controller crds`` prints them as multi-document YAML (``kubectl apply -f -`` or the chart's
crds/ directory). Pure: returns data and text.
"""

from __future__ import annotations

from typing import Any

import yaml

from controller.api.resources import RESOURCES, VERSION, Resource
from controller.api.schema import openapi

_READY = '.status.conditions[?(@.type=="Ready")]'
_AGE: dict[str, Any] = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_GATEWAY_HEALTH: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": f"{_READY}.status",
        "description": "The Ready condition.",
    },
    {
        "name": "Tunnels",
        "type": "string",
        "jsonPath": ".status.tunnelsSummary",
        "description": "Tunnels (IPsec) or peers (WireGuard) up, of those planned (the status-agent).",
    },
    _AGE,
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": f"{_READY}.reason",
        "priority": 1,
        "description": "Why Ready is what it is (kubectl describe has the message).",
    },
]
_NODE: dict[str, Any] = {"name": "Node", "type": "string", "jsonPath": ".status.nodeName"}
_PUBLIC_IP: dict[str, Any] = {"name": "Public IP", "type": "string", "jsonPath": ".status.publicIP"}
_STANDBY: dict[str, Any] = {
    "name": "Standby",
    "type": "string",
    "jsonPath": '.status.conditions[?(@.type=="StandbyReady")].status',
    "priority": 1,
    "description": "Warm-standby HA: the StandbyReady condition (True: a standby can take over); <none> "
    "without spec.ha.enabled.",
}
_PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "VPNGateway": [
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        _NODE,
        _PUBLIC_IP,
        *_GATEWAY_HEALTH,
        _STANDBY,
    ],
    "VPNPeer": [
        {"name": "Gateway", "type": "string", "jsonPath": ".spec.gatewayRef.name"},
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {
            "name": "State",
            "type": "string",
            "jsonPath": ".status.state",
            "description": "Established, Connecting, Down, AuthFailed or NotAdmitted (status.state).",
        },
        _AGE,
        {"name": "Endpoint", "type": "string", "jsonPath": ".spec.endpoint", "priority": 1},
    ],
    "IPsecGateway": [_NODE, _PUBLIC_IP, *_GATEWAY_HEALTH],
    "ClusterLink": [{"name": "Router", "type": "string", "jsonPath": ".spec.routerID"}, _AGE],
}
"""``kubectl get`` columns, Age included where it stands; ``priority: 1`` ones only with ``-o wide``."""
CATEGORIES = ["vpn"]
"""``kubectl get vpn`` lists all four kinds."""


def schema_of(resource: Resource) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one resource."""
    schema = openapi(resource.root)
    # A CRD may not describe metadata beyond its type (the API server validates ObjectMeta itself);
    # metadata.name is constrained by the root CEL rule instead.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def crd(resource: Resource) -> dict[str, Any]:
    singular = resource.kind.lower()
    columns = [dict(c) for c in _PRINTER_COLUMNS[resource.kind]]
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
                "categories": list(CATEGORIES),
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
