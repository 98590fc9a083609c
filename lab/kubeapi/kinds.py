"""Per-kind behaviour of the registry strategies the emulator models (pure functions on dicts).

What each built-in kind's strategy does on create/update that clients can observe: a subset of defaulting
(Deployment, Pod, Secret, Namespace), status reset on create for kinds with a status subresource,
Secret ``stringData`` folded into ``data``, ``immutable`` ConfigMaps/Secrets, CRD status conditions, and
the conversion between core/v1 Events and events.k8s.io/v1 Events (one storage, two views).
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from lab.kubeapi.errors import ApiError, FieldError, bad_request
from lab.kubeapi.podspec import default_pod_requests
from lab.kubeapi.resources import ResourceType

SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS_LABEL_KINDS = frozenset({("", "namespaces"), ("", "services")})
PATH_SEGMENT_KINDS = frozenset(
    {
        ("rbac.authorization.k8s.io", p)
        for p in ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
    }
)


def validate_name(rtype: ResourceType, name: str) -> list[FieldError]:
    if rtype.key in PATH_SEGMENT_KINDS:
        # RBAC names are path segments (system:discovery)
        if name in (".", "..") or "/" in name or "%" in name:
            return [FieldError("metadata.name", "Invalid value", 'may not contain "/" or "%"', name, True)]
        return []
    if rtype.key in DNS_LABEL_KINDS:
        if len(name) > 63 or not LABEL.match(name):
            return [FieldError("metadata.name", "Invalid value", LABEL_MSG, name, True)]
        return []
    if len(name) > 253 or not SUBDOMAIN.match(name):
        return [FieldError("metadata.name", "Invalid value", SUBDOMAIN_MSG, name, True)]
    return []


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def validate_labels(meta: Mapping[str, Any]) -> list[FieldError]:
    errs: list[FieldError] = []
    for k, v in (meta.get("labels") or {}).items():
        prefix, _, name = k.rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _QUALIFIED.match(name)
            or (prefix and not SUBDOMAIN.match(prefix))
        ):
            errs.append(
                FieldError(
                    "metadata.labels",
                    "Invalid value",
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                    "start and end "
                    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
                    "regex used for "
                    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                    k,
                    True,
                )
            )
        if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
            errs.append(
                FieldError(
                    "metadata.labels",
                    "Invalid value",
                    "a valid label must be an empty string or consist of alphanumeric characters, "
                    "'-', '_' or "
                    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
                    "'my_value',  "
                    "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                    v,
                    True,
                )
            )
    return errs


def initial_status(rtype: ResourceType) -> dict[str, Any] | None:
    """The status a create leaves (kinds with a status subresource cannot set it on create)."""
    if rtype.key == ("", "pods"):
        return {"phase": "Pending", "qosClass": "BestEffort"}
    if rtype.key == ("apps", "deployments"):
        return {}
    if rtype.key == ("policy", "poddisruptionbudgets"):
        return {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}
    if rtype.key == ("", "services"):
        return {"loadBalancer": {}}
    return None


def _default_field_ref(ref: Any) -> None:
    if isinstance(ref, dict):
        ref.setdefault("apiVersion", "v1")  # SetDefaults_ObjectFieldSelector


def _default_probe(probe: Any) -> None:
    """SetDefaults_Probe and SetDefaults_HTTPGetAction (kubernetes pkg/apis/core/v1/defaults.go)."""
    if not isinstance(probe, dict):
        return
    probe.setdefault("timeoutSeconds", 1)
    probe.setdefault("periodSeconds", 10)
    probe.setdefault("successThreshold", 1)
    probe.setdefault("failureThreshold", 3)
    get = probe.get("httpGet")
    if isinstance(get, dict):
        get.setdefault("path", "/")
        get.setdefault("scheme", "HTTP")


def _default_volume(volume: Any) -> None:
    """SetDefaults_{ConfigMap,Secret,Projected,DownwardAPI}VolumeSource (mode 0644 = 420),
    SetDefaults_ServiceAccountTokenProjection (3600 s), field selectors' apiVersion."""
    if not isinstance(volume, dict):
        return
    for kind in ("configMap", "secret", "projected", "downwardAPI"):
        source = volume.get(kind)
        if isinstance(source, dict):
            source.setdefault("defaultMode", 420)
            for item in source.get("items") or []:
                if isinstance(item, dict):
                    _default_field_ref(item.get("fieldRef"))
    for projection in (volume.get("projected") or {}).get("sources") or []:
        if not isinstance(projection, dict):
            continue
        token = projection.get("serviceAccountToken")
        if isinstance(token, dict):
            token.setdefault("expirationSeconds", 3600)
        for item in (projection.get("downwardAPI") or {}).get("items") or []:
            if isinstance(item, dict):
                _default_field_ref(item.get("fieldRef"))


def _default_pod_spec(spec: dict[str, Any]) -> None:
    """SetDefaults_PodSpec and what it reaches (kubernetes pkg/apis/core/v1/defaults.go); checked against
    kube-apiserver v1.35.4 by tests/integration/test_kube_differential.py (the gateway's Deployment)."""
    if spec.get("serviceAccountName") and not spec.get("serviceAccount"):
        spec["serviceAccount"] = spec["serviceAccountName"]  # DeprecatedServiceAccount
    for v in spec.get("volumes") or []:
        _default_volume(v)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        if not isinstance(c, dict):
            continue
        image = str(c.get("image", ""))
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        c.setdefault("imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
        for p in c.get("ports", []) or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            _default_probe(c.get(probe))
        for e in c.get("env") or []:
            if isinstance(e, dict):
                _default_field_ref((e.get("valueFrom") or {}).get("fieldRef"))


def apply_defaults(rtype: ResourceType, obj: dict[str, Any]) -> None:
    """A subset of the built-in defaulting (the fields controllers and kubectl commonly read)."""
    key = rtype.key
    if key == ("apps", "deployments"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy",
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
        )
        tmpl = spec.setdefault("template", {})
        tmpl.setdefault("metadata", {})
        _default_pod_spec(tmpl.setdefault("spec", {}))
    elif key == ("", "pods"):
        _default_pod_spec(obj.setdefault("spec", {}))
        default_pod_requests(obj["spec"])
    elif key == ("", "secrets"):
        obj.setdefault("type", "Opaque")
    elif key == ("", "namespaces"):
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    elif key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports", []) or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))


def fold_secret(obj: dict[str, Any]) -> list[FieldError]:
    """stringData is write-only: merged into data (base64) and dropped; data must be base64."""
    errs: list[FieldError] = []
    data = obj.get("data") or {}
    for k, v in list(data.items()):
        try:
            base64.b64decode(str(v), validate=True)
        except (binascii.Error, ValueError):
            errs.append(FieldError(f"data[{k}]", "Invalid value", "illegal base64 data", "<secret>", False))
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = dict(data)
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj["data"] = data
    return errs


_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
CONFIG_MAP_MAX = 1024 * 1024
"""core.MaxSecretSize: what a ConfigMap's data and binaryData may hold together."""


def _config_key_errors(key: str) -> list[str]:
    """``IsConfigMapKey`` (apimachinery pkg/util/validation/validation.go), its messages word for word."""
    errs = []
    if len(key) > 253:
        errs.append("must be no more than 253 characters")
    if not _CONFIG_KEY.fullmatch(key):
        errs.append(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  "
            "or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
        )
    if key == ".":
        errs.append("must not be '.'")
    elif key == "..":
        errs.append("must not be '..'")
    elif key.startswith(".."):
        errs.append("must not start with '..'")
    return errs


LEASE_KEY = ("coordination.k8s.io", "leases")
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"
"""apimachinery's ``metav1.RFC3339Micro``, the only layout a ``MicroTime`` is parsed with."""
_MICRO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{6})(Z|[+-]\d\d:\d\d)")


def micro_time(value: Any) -> str:
    """A ``metav1.MicroTime`` as kube-apiserver decodes and prints it: ``MicroTime.UnmarshalJSON``
    (apimachinery v0.35.4 pkg/apis/meta/v1/micro_time.go) is ``time.Parse(RFC3339Micro, s)``, so exactly six
    fraction digits and a ``Z`` or ``+hh:mm`` zone, nothing else (no ``Z`` without a fraction, no nano
    seconds); it is printed back in UTC. Raises ValueError with the reason (Go's words are not copied)."""
    if not isinstance(value, str):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go value of type string")
    m = _MICRO.fullmatch(value)
    if m is None:
        raise ValueError(f'parsing time "{value}" as "{RFC3339_MICRO}": cannot parse it')
    y, mo, d, h, mi, sec, frac, zone = m.groups()
    tz = UTC
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        t = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), int(frac), tzinfo=tz)
    except ValueError as exc:
        raise ValueError(f'parsing time "{value}": {exc}') from None
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decode_lease(obj: dict[str, Any], version: str) -> None:
    """A Lease decoded into its Go type: ``acquireTime``/``renewTime`` parsed as MicroTime (a 400 when they
    do not parse, as kube-apiserver v1.35.4 answers: ``Lease in version "v1" cannot be handled as a Lease:
    parsing time ...``) and stored in UTC; ``null`` ones dropped (omitempty)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for key in ("acquireTime", "renewTime"):
        if key not in spec:
            continue
        if spec[key] is None:
            del spec[key]
            continue
        try:
            spec[key] = micro_time(spec[key])
        except ValueError as exc:
            raise _lease_bad_request(version, str(exc)) from None


def _lease_bad_request(version: str, why: str) -> ApiError:
    return bad_request(f'Lease in version "{version}" cannot be handled as a Lease: {why}')


def validate_lease(obj: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateLeaseSpec`` (kubernetes v1.35.4 pkg/apis/coordination/validation/validation.go), its two
    numeric rules: ``leaseDurationSeconds`` > 0 and ``leaseTransitions`` >= 0 when set. (``strategy`` and
    ``preferredHolder`` are not modelled.)"""
    spec = obj.get("spec") or {}
    errs: list[FieldError] = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if isinstance(duration, int) and duration <= 0:
        errs.append(
            FieldError("spec.leaseDurationSeconds", "Invalid value", "must be greater than 0", duration, True)
        )
    if isinstance(transitions, int) and transitions < 0:
        errs.append(
            FieldError(
                "spec.leaseTransitions",
                "Invalid value",
                "must be greater than or equal to 0",
                transitions,
                True,
            )
        )
    return errs


def validate_event_namespace(obj: Mapping[str, Any]) -> list[FieldError]:
    """A core/v1 Event's namespace agrees with its involved object's (kubernetes
    pkg/apis/core/validation/events.go legacyValidateEvent; its other rules are not modelled): without
    ``eventTime``, a namespaced involved object's namespace must be the Event's, a cluster-scoped one's
    Event lives in "" or default; with it, a cluster-scoped one's in default or kube-system."""
    ns = str((obj.get("metadata") or {}).get("namespace") or "")
    involved = str((obj.get("involvedObject") or {}).get("namespace") or "")
    if not obj.get("eventTime"):
        ok = ns in ("", "default") if not involved else ns == involved
    else:
        ok = bool(involved) or ns in ("default", "kube-system")
    if ok:
        return []
    return [
        FieldError(
            "involvedObject.namespace", "Invalid value", "does not match event.namespace", involved, True
        )
    ]


def validate_config_map(obj: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateConfigMap`` (kubernetes pkg/apis/core/validation/validation.go), in its order and words:
    every key a config key, a ``data`` key also in ``binaryData`` reported at ``data[key]``, and the values
    together, ``binaryData`` decoded, at most 1 MiB (reported at the empty path, printed ``[]``). Checked
    against kube-apiserver v1.35.4 by tests/integration/test_kube_differential.py."""
    errs: list[FieldError] = []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    total = 0
    for key, value in data.items():
        errs += [FieldError(f"data[{key}]", "Invalid value", m, key, True) for m in _config_key_errors(key)]
        if key in binary:
            errs.append(
                FieldError(
                    f"data[{key}]", "Invalid value", "duplicate of key present in binaryData", key, True
                )
            )
        total += len(str(value).encode())
    for key, value in binary.items():
        errs += [
            FieldError(f"binaryData[{key}]", "Invalid value", m, key, True) for m in _config_key_errors(key)
        ]
        try:
            total += len(base64.b64decode(str(value), validate=True))
        except (binascii.Error, ValueError):
            total += len(str(value))
    if total > CONFIG_MAP_MAX:
        errs.append(FieldError("[]", "Too long", f"may not be more than {CONFIG_MAP_MAX} bytes"))
    return errs


def immutable_violation(
    rtype: ResourceType, old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[FieldError]:
    if rtype.key not in (("", "configmaps"), ("", "secrets")) or not old.get("immutable"):
        return []
    errs = []
    for f in ("data", "binaryData"):
        if (old.get(f) or {}) != (new.get(f) or {}):
            errs.append(FieldError(f, "Forbidden", "field is immutable when `immutable` is set"))
    if not new.get("immutable"):
        errs.append(FieldError("immutable", "Forbidden", "field is immutable when `immutable` is set"))
    return errs


def crd_status(crd: Mapping[str, Any], now: str, old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the apiextensions controllers write: names accepted, established, stored versions."""
    spec = crd.get("spec") or {}
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    versions = spec.get("versions") or []
    stored = [v["name"] for v in versions if v.get("storage")]
    old_status = (old or {}).get("status") or {}
    prev_stored = list(old_status.get("storedVersions") or [])
    conds_old = {c.get("type"): c for c in old_status.get("conditions") or []}

    def cond(t: str, reason: str, message: str) -> dict[str, Any]:
        prev = conds_old.get(t)
        ts = prev["lastTransitionTime"] if prev and prev.get("status") == "True" else now
        return {"type": t, "status": "True", "lastTransitionTime": ts, "reason": reason, "message": message}

    return {
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": names,
        "storedVersions": prev_stored + [v for v in stored if v not in prev_stored],
    }


def validate_crd(crd: Mapping[str, Any]) -> list[FieldError]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errs: list[FieldError] = []
    name = (crd.get("metadata") or {}).get("name", "")
    if not spec.get("group"):
        errs.append(FieldError("spec.group", "Required value"))
    if not names.get("plural"):
        errs.append(FieldError("spec.names.plural", "Required value"))
    if not names.get("kind"):
        errs.append(FieldError("spec.names.kind", "Required value"))
    if name != f"{names.get('plural', '')}.{spec.get('group', '')}":
        errs.append(
            FieldError(
                "metadata.name", "Invalid value", 'must be spec.names.plural+"."+spec.group', name, True
            )
        )
    versions = spec.get("versions") or []
    if not versions or sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(
            FieldError(
                "spec.versions",
                "Invalid value",
                "must have exactly one version marked as storage version",
                [],
                False,
            )
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errs.append(
            FieldError(
                "spec.scope",
                "Unsupported value",
                'supported values: "Cluster", "Namespaced"',
                spec.get("scope", ""),
                True,
            )
        )
    return errs


# --- core/v1 Event <-> events.k8s.io/v1 Event ----------------------------------------------------

_EVENT_MAP = (
    ("involvedObject", "regarding"),
    ("related", "related"),
    ("message", "note"),
    ("reason", "reason"),
    ("type", "type"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("action", "action"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
)


def event_to_v1beta(core: Mapping[str, Any]) -> dict[str, Any]:
    """core/v1 Event as events.k8s.io/v1."""
    out: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "events.k8s.io/v1",
        "metadata": core.get("metadata", {}),
    }
    for c, e in _EVENT_MAP:
        if c in core and core[c] is not None:
            out[e] = copy.deepcopy(core[c])
    if isinstance(out.get("series"), dict) and "lastObservedTime" in out["series"]:
        pass
    return out


def event_to_core(ev: Mapping[str, Any]) -> dict[str, Any]:
    """events.k8s.io/v1 Event as core/v1 (the storage form)."""
    out: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": copy.deepcopy(ev.get("metadata", {})),
    }
    for c, e in _EVENT_MAP:
        if e in ev and ev[e] is not None:
            out[c] = copy.deepcopy(ev[e])
    out.setdefault("involvedObject", {})
    return out
