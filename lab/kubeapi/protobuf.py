"""Decoding of Kubernetes protobuf REQUEST bodies for the kinds ``kubectl create <kind>`` sends (pure).

client-go's generated clients for built-in kinds are forced to protobuf
(``application/vnd.kubernetes.protobuf``)
and do not fall back to JSON on a 415 (client-go only falls back for CBOR: rest/client.go,
``requestClientContentConfigProvider.UnsupportedMediaType``), so ``kubectl create configmap|secret|namespace|
serviceaccount|role|clusterrole|rolebinding|clusterrolebinding|token`` and ``kubectl auth can-i|whoami`` can
only work if the server reads protobuf.
Responses stay JSON: those clients accept JSON answers. Other kinds in protobuf answer 415, as a real server
does for a type it cannot decode.

The envelope is ``k8s\\x00`` + runtime.Unknown{typeMeta=1, raw=2, contentEncoding=3, contentType=4}; field
numbers below are those of the kinds' generated.proto files. Go marshals empty strings and false booleans
too; they are dropped here, as JSON ``omitempty`` would.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# message -> field number -> (json name, type, repeated). Types: "string", "bytes", "bool", "int",
# "time", "map<string>", "map<bytes>" or another message name.
Field = tuple[str, str, bool]
SCHEMAS: dict[str, dict[int, Field]] = {
    "Unknown": {
        1: ("typeMeta", "TypeMeta", False),
        2: ("raw", "bytes", False),
        3: ("contentEncoding", "string", False),
        4: ("contentType", "string", False),
    },
    "TypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "int", False),
        2: ("preconditions", "Preconditions", False),
        3: ("orphanDependents", "bool", False),
        4: ("propagationPolicy", "string", False),
        5: ("dryRun", "string", True),
    },
    "Preconditions": {1: ("uid", "string", False), 2: ("resourceVersion", "string", False)},
    "ObjectMeta": {
        1: ("name", "string", False),
        2: ("generateName", "string", False),
        3: ("namespace", "string", False),
        5: ("uid", "string", False),
        6: ("resourceVersion", "string", False),
        7: ("generation", "int", False),
        11: ("labels", "map<string>", False),
        12: ("annotations", "map<string>", False),
        13: ("ownerReferences", "OwnerReference", True),
        14: ("finalizers", "string", True),
    },
    "OwnerReference": {
        1: ("kind", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
        6: ("controller", "bool", False),
        7: ("blockOwnerDeletion", "bool", False),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map<string>", False),
        3: ("binaryData", "map<bytes>", False),
        4: ("immutable", "bool", False),
    },
    "Secret": {
        1: ("metadata", "ObjectMeta", False),
        2: ("data", "map<bytes>", False),
        3: ("type", "string", False),
        4: ("stringData", "map<string>", False),
        5: ("immutable", "bool", False),
    },
    "Namespace": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "NamespaceSpec", False)},
    "NamespaceSpec": {1: ("finalizers", "string", True)},
    "ServiceAccount": {
        1: ("metadata", "ObjectMeta", False),
        2: ("secrets", "ObjectReference", True),
        3: ("imagePullSecrets", "LocalObjectReference", True),
        4: ("automountServiceAccountToken", "bool", False),
    },
    "ObjectReference": {
        1: ("kind", "string", False),
        2: ("namespace", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
        5: ("apiVersion", "string", False),
        6: ("resourceVersion", "string", False),
        7: ("fieldPath", "string", False),
    },
    "LocalObjectReference": {1: ("name", "string", False)},
    "PolicyRule": {
        1: ("verbs", "string", True),
        2: ("apiGroups", "string", True),
        3: ("resources", "string", True),
        4: ("resourceNames", "string", True),
        5: ("nonResourceURLs", "string", True),
    },
    "Role": {1: ("metadata", "ObjectMeta", False), 2: ("rules", "PolicyRule", True)},
    "ClusterRole": {
        1: ("metadata", "ObjectMeta", False),
        2: ("rules", "PolicyRule", True),
        3: ("aggregationRule", "AggregationRule", False),
    },
    "AggregationRule": {1: ("clusterRoleSelectors", "LabelSelector", True)},
    "LabelSelector": {
        1: ("matchLabels", "map<string>", False),
        2: ("matchExpressions", "LabelSelectorRequirement", True),
    },
    "LabelSelectorRequirement": {
        1: ("key", "string", False),
        2: ("operator", "string", False),
        3: ("values", "string", True),
    },
    "Subject": {
        1: ("kind", "string", False),
        2: ("apiGroup", "string", False),
        3: ("name", "string", False),
        4: ("namespace", "string", False),
    },
    "RoleRef": {1: ("apiGroup", "string", False), 2: ("kind", "string", False), 3: ("name", "string", False)},
    "RoleBinding": {
        1: ("metadata", "ObjectMeta", False),
        2: ("subjects", "Subject", True),
        3: ("roleRef", "RoleRef", False),
    },
    "ClusterRoleBinding": {
        1: ("metadata", "ObjectMeta", False),
        2: ("subjects", "Subject", True),
        3: ("roleRef", "RoleRef", False),
    },
    "TokenRequest": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "TokenRequestSpec", False)},
    "TokenRequestSpec": {
        1: ("audiences", "string", True),
        3: ("boundObjectRef", "BoundObjectReference", False),
        4: ("expirationSeconds", "int", False),
    },
    "BoundObjectReference": {
        1: ("kind", "string", False),
        2: ("apiVersion", "string", False),
        3: ("name", "string", False),
        4: ("uid", "string", False),
    },
    "SelfSubjectAccessReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SelfSubjectAccessReviewSpec", False),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes", False),
        2: ("nonResourceAttributes", "NonResourceAttributes", False),
    },
    "SubjectAccessReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SubjectAccessReviewSpec", False),
    },
    "SubjectAccessReviewSpec": {
        1: ("resourceAttributes", "ResourceAttributes", False),
        2: ("nonResourceAttributes", "NonResourceAttributes", False),
        3: ("user", "string", False),
        4: ("groups", "string", True),
        6: ("uid", "string", False),
    },
    "ResourceAttributes": {
        1: ("namespace", "string", False),
        2: ("verb", "string", False),
        3: ("group", "string", False),
        4: ("version", "string", False),
        5: ("resource", "string", False),
        6: ("subresource", "string", False),
        7: ("name", "string", False),
    },
    "NonResourceAttributes": {1: ("path", "string", False), 2: ("verb", "string", False)},
    "SelfSubjectRulesReview": {
        1: ("metadata", "ObjectMeta", False),
        2: ("spec", "SelfSubjectRulesReviewSpec", False),
    },
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "string", False)},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta", False)},
}
DECODABLE = {
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "Namespace"): "Namespace",
    ("v1", "DeleteOptions"): "DeleteOptions",
    ("meta.k8s.io/v1", "DeleteOptions"): "DeleteOptions",
    ("v1", "ServiceAccount"): "ServiceAccount",
    **{
        ("rbac.authorization.k8s.io/v1", k): k
        for k in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    },
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
    ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview",
    **{
        ("authorization.k8s.io/v1", k): k
        for k in ("SelfSubjectAccessReview", "SubjectAccessReview", "SelfSubjectRulesReview")
    },
}


class DecodeError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift, out = 0, 0
    while True:
        if i >= len(buf):
            raise DecodeError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7
        if shift > 70:
            raise DecodeError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """The raw (field number, wire type, value) triples of one message."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        v: int | bytes
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise DecodeError("truncated field")
            v, i = buf[i : i + n], i + n
        elif wt == 1:
            v, i = buf[i : i + 8], i + 8
        elif wt == 5:
            v, i = buf[i : i + 4], i + 4
        else:
            raise DecodeError(f"unsupported wire type {wt}")
        out.append((num, wt, v))
    return out


def _time(buf: bytes) -> str | None:
    secs = 0
    for num, _, v in fields(buf):
        if num == 1:
            secs = v
    if secs == 0:
        return None
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def message(name: str, buf: bytes) -> dict[str, Any]:
    schema = SCHEMAS[name]
    out: dict[str, Any] = {}
    for num, _, v in fields(buf):
        spec = schema.get(num)
        if spec is None:
            continue  # a field we do not model (e.g. managedFields): ignored
        key, typ, repeated = spec
        if typ.startswith("map<"):
            k = val = None
            for n2, _, v2 in fields(v):
                if n2 == 1:
                    k = v2.decode()
                elif n2 == 2:
                    val = base64.b64encode(v2).decode() if typ == "map<bytes>" else v2.decode()
            if k is not None:
                out.setdefault(key, {})[k] = val if val is not None else ""
            continue
        if typ == "string":
            value: Any = v.decode()
        elif typ == "bytes":
            value = bytes(v)
        elif typ == "bool":
            value = bool(v)
        elif typ == "int":
            value = int(v)
        elif typ == "time":
            value = _time(v)
        else:
            value = message(typ, v)
        if repeated:
            out.setdefault(key, []).append(value)
        elif value not in ("", False, None, 0) or typ not in ("string", "bool", "time", "int"):
            out[key] = value
    return {k: v for k, v in out.items() if v != {} or k in ("spec",)}


def decode(raw: bytes) -> dict[str, Any] | None:
    """The JSON form of a protobuf-encoded object, or None when its kind is not modelled."""
    if not raw.startswith(MAGIC):
        return None
    try:
        unknown = message("Unknown", raw[len(MAGIC) :])
        tm: Mapping[str, Any] = unknown.get("typeMeta") or {}
        kind = DECODABLE.get((str(tm.get("apiVersion", "")), str(tm.get("kind", ""))))
        if kind is None or unknown.get("contentEncoding"):
            return None
        obj = message(kind, unknown.get("raw", b""))
    except (DecodeError, UnicodeDecodeError, KeyError):
        return None
    return {"apiVersion": tm["apiVersion"], "kind": tm["kind"], **obj}
