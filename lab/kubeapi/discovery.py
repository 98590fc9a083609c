"""Discovery and OpenAPI documents built from the registry (pure).

Legacy (unaggregated) discovery only: client-go asks for aggregated discovery first and, when the answer's
Content-Type is plain ``application/json``, reads it as APIVersions/APIGroupList and walks the group
versions. OpenAPI v3 is served only as far as kubectl needs it: per group-version a document whose PATCH
operations carry ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` query parameter, so
kubectl's query-param verifier sees server-side field validation and skips client-side schema validation
(apply without --validate=false). The request bodies list no strategic-merge type, so kubectl computes
strategic merge patches from its compiled-in types (not from OpenAPI schemas, which are not served);
/openapi/v2 is a 404, which kubectl tolerates.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lab.kubeapi.resources import SUBRESOURCE_KINDS, Registry, ResourceType

VERSION = {
    "major": "1",
    "minor": "35",
    "emulationMajor": "1",
    "emulationMinor": "35",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "34",
    "gitVersion": "v1.35.0+kubeapi-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

GROUP_ORDER = (
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _resource_entries(t: ResourceType, version: str) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": t.plural,
        "singularName": t.singular or t.kind.lower(),
        "namespaced": t.namespaced,
        "kind": t.kind,
        "verbs": list(t.verbs),
        "storageVersionHash": _hash(f"{t.group}/{t.plural}")[:12],
    }
    if t.short_names:
        main["shortNames"] = list(t.short_names)
    if t.categories:
        main["categories"] = list(t.categories)
    out = [main]
    for sub in sorted(t.subresources):
        entry: dict[str, Any] = {"name": f"{t.plural}/{sub}", "singularName": "", "namespaced": t.namespaced}
        if sub in SUBRESOURCE_KINDS:
            api_version, kind = SUBRESOURCE_KINDS[sub]
            group, _, ver = api_version.rpartition("/")
            entry.update(kind=kind, group=group, version=ver)
        else:
            entry["kind"] = t.kind
        entry["verbs"] = (
            ["create"] if sub == "token" else ["update"] if sub == "finalize" else ["get", "patch", "update"]
        )
        out.append(entry)
    return out


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def resource_list(reg: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = reg.in_group_version(group, version)
    if not types:
        return None
    resources = [e for t in sorted(types, key=lambda t: t.plural) for e in _resource_entries(t, version)]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _sorted_groups(reg: Registry) -> list[tuple[str, list[str]]]:
    groups = reg.groups()

    def rank(g: str) -> tuple[int, str]:
        return (GROUP_ORDER.index(g), g) if g in GROUP_ORDER else (len(GROUP_ORDER), g)

    return [(g, groups[g]) for g in sorted(groups, key=rank)]


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs, "preferredVersion": vs[0]}


def group_list(reg: Registry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {k: v for k, v in api_group(g, vs).items() if k not in ("kind", "apiVersion")}
            for g, vs in _sorted_groups(reg)
        ],
    }


def group(reg: Registry, name: str) -> dict[str, Any] | None:
    versions = reg.groups().get(name)
    return api_group(name, versions) if versions else None


# --- OpenAPI v3 (what kubectl's field-validation verifier reads) ------------------------------------------

PATCH_BODY_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_v3_doc(reg: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in reg.in_group_version(group, version) if not t.virtual]
    if not types and not reg.in_group_version(group, version):
        return None
    prefix = "/" + _gv_path(group, version)
    params = [
        {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for n in ("dryRun", "fieldManager", "fieldValidation", "force")
    ]
    paths: dict[str, Any] = {}
    for t in types:
        gvk = {"group": t.group, "version": version, "kind": t.kind}
        item = (
            f"{prefix}/namespaces/{{namespace}}/{t.plural}/{{name}}"
            if t.namespaced
            else f"{prefix}/{t.plural}/{{name}}"
        )
        op = {
            "operationId": f"patch{t.kind}",
            "parameters": params,
            "requestBody": {
                "content": {ct: {"schema": {"type": "object"}} for ct in PATCH_BODY_TYPES},
                "required": True,
            },
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
        }
        paths[item] = {"patch": op}
        if t.has_status:
            paths[item + "/status"] = {"patch": {**op, "operationId": f"patch{t.kind}Status"}}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubeapi emulator)", "version": VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi_v3_root(reg: Registry) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    gvs = [("", "v1")] + [(g, v) for g, vs in _sorted_groups(reg) for v in vs]
    for g, v in gvs:
        doc = openapi_v3_doc(reg, g, v)
        if doc is None:
            continue
        h = _hash(json.dumps(doc, sort_keys=True))
        paths[_gv_path(g, v)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash={h}"}
    return {"paths": paths}
