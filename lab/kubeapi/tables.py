"""Server-side Table output (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``), pure.

CRDs: Name, then the additionalPrinterColumns evaluated with a JSONPath subset (``.a.b``, ``[N]``, ``[*]``,
``[?(@.k=="v")]``), first result only, typed as apiextensions' table convertor types them (``date`` becomes a
human duration); with no columns, Name and Age. Built-ins: the columns kubectl users know (an approximation
of pkg/printers/internalversion for the kinds served).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from lab.kubeapi.resources import Column, ResourceType
from lab.kubeapi.selectors import format_label_selector

NAME = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def parse_time(ts: str) -> datetime | None:
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        try:
            return datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except (TypeError, ValueError, AttributeError):
            return None


def age(ts: Any, now: datetime) -> str:
    t = parse_time(ts) if isinstance(ts, str) else None
    if t is None:
        return "<unknown>"
    return human_duration((now - t).total_seconds())


# --- JSONPath subset ---------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\*\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*(==|!=)\s*(\"[^\"]*\"|'[^']*'|[^)\s]+)\)\]|\.\."
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """All results of a simple JSONPath (``{}`` braces optional)."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    if p.startswith("$"):
        p = p[1:]
    results = [obj]
    pos = 0
    while pos < len(p):
        m = _TOKEN.match(p, pos)
        if m is None:
            return []
        pos = m.end()
        nxt: list[Any] = []
        if m.group(1) is not None:
            nxt = [r[m.group(1)] for r in results if isinstance(r, Mapping) and m.group(1) in r]
        elif m.group(2) is not None:
            i = int(m.group(2))
            nxt = [r[i] for r in results if isinstance(r, list) and i < len(r)]
        elif m.group(0) == "[*]":
            for r in results:
                if isinstance(r, list):
                    nxt.extend(r)
                elif isinstance(r, Mapping):
                    nxt.extend(r.values())
        elif m.group(3) is not None:
            want = m.group(5).strip("\"'")
            for r in results:
                for item in r if isinstance(r, list) else []:
                    got = item
                    for part in m.group(3).split("."):
                        got = got.get(part) if isinstance(got, Mapping) else None
                    if (str(got) == want if not isinstance(got, bool) else str(got).lower() == want) == (
                        m.group(4) == "=="
                    ):
                        nxt.append(item)
        else:
            return []
        results = nxt
    return results


def _cell(col: Column, obj: Mapping[str, Any], now: datetime) -> Any:
    found = jsonpath(obj, col.json_path)
    if not found:
        return None
    value = found[0]
    if value is None:
        return None
    if col.type == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)
    if col.type == "integer":
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if col.type == "number":
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if col.type == "boolean":
        return value if isinstance(value, bool) else None
    if col.type == "date":
        return age(value, now) if isinstance(value, str) else None
    return None


def _col(
    name: str, type_: str = "string", priority: int = 0, description: str = "", fmt: str = ""
) -> dict[str, Any]:
    return {"name": name, "type": type_, "format": fmt, "description": description, "priority": priority}


def _count(v: Any) -> int:
    return len(v) if isinstance(v, Mapping | list) else 0


def _pod_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    cs = status.get("containerStatuses") or []
    ready = sum(1 for c in cs if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in cs)
    phase = status.get("reason") or status.get("phase") or ""
    if o.get("metadata", {}).get("deletionTimestamp"):
        phase = "Terminating"
    return [
        ready_str(ready, len(spec.get("containers") or [])),
        phase,
        restarts,
        age(o["metadata"].get("creationTimestamp"), now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


def ready_str(ready: int, total: int) -> str:
    return f"{ready}/{total}"


def _node_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    conds = {c.get("type"): c.get("status") for c in (o.get("status") or {}).get("conditions") or []}
    state = "Ready" if conds.get("Ready") == "True" else "NotReady" if "Ready" in conds else "Unknown"
    if (o.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (o.get("metadata") or {}).get("labels") or {}
    roles = (
        ",".join(sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")))
        or "<none>"
    )
    version = ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [state, roles, age(o["metadata"].get("creationTimestamp"), now), version]


def _event_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    last = o.get("lastTimestamp") or o.get("eventTime") or (o.get("metadata") or {}).get("creationTimestamp")
    inv = o.get("involvedObject") or {}
    obj = f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}"
    return [age(last, now), o.get("type", ""), o.get("reason", ""), obj, o.get("message", "")]


def _deploy_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    return [
        ready_str(int(status.get("readyReplicas", 0)), int(spec.get("replicas", 0))),
        int(status.get("updatedReplicas", 0)),
        int(status.get("availableReplicas", 0)),
        age(o["metadata"].get("creationTimestamp"), now),
    ]


def _pdb_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    spec = o.get("spec") or {}
    return [
        str(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
        str(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
        int((o.get("status") or {}).get("disruptionsAllowed", 0)),
        age(o["metadata"].get("creationTimestamp"), now),
    ]


def _svc_row(o: Mapping[str, Any], now: datetime) -> list[Any]:
    spec = o.get("spec") or {}
    ports = (
        ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []) or "<none>"
    )
    return [
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP") or "<none>",
        "<none>",
        ports,
        age(o["metadata"].get("creationTimestamp"), now),
    ]


def _binding_role(o: Mapping[str, Any]) -> str:
    ref = o.get("roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


Printer = tuple[list[dict[str, Any]], Callable[[Mapping[str, Any], datetime], list[Any]]]

AGE = _col(
    "Age",
    description="CreationTimestamp is a timestamp representing the server time when this object was created.",
)


def _created(o: Mapping[str, Any], now: datetime) -> list[Any]:
    return [age(o["metadata"].get("creationTimestamp"), now)]


BUILTIN_PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "namespaces"): (
        [_col("Status"), AGE],
        lambda o, n: [(o.get("status") or {}).get("phase", ""), *_created(o, n)],
    ),
    ("", "configmaps"): (
        [_col("Data", "integer"), AGE],
        lambda o, n: [_count(o.get("data")) + _count(o.get("binaryData")), *_created(o, n)],
    ),
    ("", "secrets"): (
        [_col("Type"), _col("Data", "integer"), AGE],
        lambda o, n: [o.get("type", ""), _count(o.get("data")), *_created(o, n)],
    ),
    ("", "serviceaccounts"): (
        [_col("Secrets", "integer"), AGE],
        lambda o, n: [_count(o.get("secrets")), *_created(o, n)],
    ),
    ("", "pods"): (
        [
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "string"),
            AGE,
            _col("IP", priority=1),
            _col("Node", priority=1),
        ],
        _pod_row,
    ),
    ("", "nodes"): ([_col("Status"), _col("Roles"), AGE, _col("Version")], _node_row),
    ("", "services"): (
        [_col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE],
        _svc_row,
    ),
    ("", "events"): (
        [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
        _event_row,
    ),
    ("apps", "deployments"): (
        [_col("Ready"), _col("Up-to-date", "integer"), _col("Available", "integer"), AGE],
        _deploy_row,
    ),
    ("rbac.authorization.k8s.io", "roles"): (
        [_col("Created At", fmt="date")],
        lambda o, n: [o["metadata"].get("creationTimestamp", "")],
    ),
    ("rbac.authorization.k8s.io", "clusterroles"): (
        [_col("Created At", fmt="date")],
        lambda o, n: [o["metadata"].get("creationTimestamp", "")],
    ),
    ("rbac.authorization.k8s.io", "rolebindings"): (
        [_col("Role"), AGE],
        lambda o, n: [_binding_role(o), *_created(o, n)],
    ),
    ("rbac.authorization.k8s.io", "clusterrolebindings"): (
        [_col("Role"), AGE],
        lambda o, n: [_binding_role(o), *_created(o, n)],
    ),
    ("networking.k8s.io", "networkpolicies"): (
        [_col("Pod-Selector"), AGE],
        lambda o, n: [format_label_selector((o.get("spec") or {}).get("podSelector")), *_created(o, n)],
    ),
    ("coordination.k8s.io", "leases"): (
        [_col("Holder"), AGE],
        lambda o, n: [(o.get("spec") or {}).get("holderIdentity", ""), *_created(o, n)],
    ),
    ("policy", "poddisruptionbudgets"): (
        [_col("Min Available"), _col("Max Unavailable"), _col("Allowed Disruptions", "integer"), AGE],
        _pdb_row,
    ),
    ("apiextensions.k8s.io", "customresourcedefinitions"): (
        [_col("Created At", fmt="date")],
        lambda o, n: [o["metadata"].get("creationTimestamp", "")],
    ),
}


def columns(
    rtype: ResourceType,
) -> tuple[list[dict[str, Any]], Callable[[Mapping[str, Any], datetime], list[Any]]]:
    if rtype.crd:
        if not rtype.columns:
            return [NAME, AGE], lambda o, n: [o["metadata"]["name"], *_created(o, n)]
        cols = [NAME] + [_col(c.name, c.type, c.priority, c.description, c.format) for c in rtype.columns]
        return cols, lambda o, n: [o["metadata"]["name"], *(_cell(c, o, n) for c in rtype.columns)]
    printer = BUILTIN_PRINTERS.get(rtype.storage_key)
    if printer is None:
        return [NAME, AGE], lambda o, n: [o["metadata"]["name"], *_created(o, n)]
    cols, row = printer
    return [NAME, *cols], lambda o, n: [o["metadata"]["name"], *row(o, n)]


def partial_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rtype: ResourceType,
    objs: Sequence[Mapping[str, Any]],
    now: datetime,
    *,
    include_object: str = "Metadata",
    resource_version: str = "",
    continue_token: str = "",
    remaining: int | None = None,
    with_columns: bool = True,
) -> dict[str, Any]:
    cols, row = columns(rtype)
    rows = []
    for o in objs:
        r: dict[str, Any] = {"cells": row(o, now)}
        if include_object == "Object":
            r["object"] = o
        elif include_object != "None":
            r["object"] = partial_metadata(o)
        rows.append(r)
    meta: dict[str, Any] = {}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if continue_token:
        meta["continue"] = continue_token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    out: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    out["columnDefinitions"] = cols if with_columns else []
    out["rows"] = rows
    return out
