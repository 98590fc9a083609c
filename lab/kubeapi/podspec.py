"""A pod spec (a Pod's, a Deployment's template) as the API server decodes and validates it (pure).

What the real server does to the parts of a pod spec the operator's settings reach, each from its
source (kubernetes v1.35.4, apimachinery v0.35.4):

* Decoding into the Go types (``core/v1`` ``ResourceRequirements``, ``Toleration``,
  ``EmptyDirVolumeSource``): every quantity parsed and printed again (``lab.kubeapi.quantity``: ``0.5`` ->
  ``500m``), those of a ``ResourceList`` (requests, limits, overhead) rounded up to 1m
  (``SetDefaults_ResourceList``, pkg/apis/core/v1/defaults.go), a value that is no quantity a 400
  (``<Kind> in version "v1" cannot be handled as a <Kind>: <the parser's error>``);
  fields the type does not have dropped with a warning (``unknown field "<path>"``), a 400 under
  ``fieldValidation=Strict``; ``omitempty`` fields that are empty (``""``, ``null``, an empty map) gone.
* ``ValidateTolerations`` (pkg/apis/core/validation/validation.go): the key a qualified name; an empty key
  only with ``Exists``; ``tolerationSeconds`` only with ``NoExecute``; ``Equal`` (or none) with a label
  value, ``Exists`` with none; ``Lt``/``Gt`` only with the (alpha, off) TaintTolerationComparisonOperators
  gate; the effect one of NoSchedule, PreferNoSchedule, NoExecute.
* ``validateResourceRequirements`` (same file): resource names, quantities not negative, integer for
  extended resources, a request at most its limit (equal to it for resources that cannot be overcommitted:
  hugepages and extended resources, whose limit is then required).

Not modelled: the other fields of a pod spec are stored as sent (no unknown-field pruning there), hugepage
sizes, resource claims, pod-level resource names beyond cpu/memory/hugepages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from lab.kubeapi.errors import ApiError, FieldError, bad_request
from lab.kubeapi.quantity import QuantityError, json_text, parse, round_up

Obj = dict[str, Any]

TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
RESOURCES_FIELDS = ("limits", "requests", "claims")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
STANDARD_RESOURCES = (
    *STANDARD_CONTAINER_RESOURCES,
    *(f"{p}.{r}" for p in ("requests", "limits") for r in STANDARD_CONTAINER_RESOURCES),
    "pods",
    "quota",
    "services",
    "replicationcontrollers",
    "secrets",
    "resourcequotas",
    "persistentvolumeclaims",
    "requests.storage",
    "configmaps",
    "services.nodeports",
    "services.loadbalancers",
)
"""helper.standardResources (pkg/apis/core/helper/helpers.go)."""

_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NAME_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_VALUE_RULE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


class Decoding:
    """One object's decode: where it is (for messages), the warnings it gathers, Strict or not."""

    def __init__(self, kind: str, version: str, strict: bool) -> None:
        self.kind, self.version, self.strict = kind, version, strict
        self.warnings: list[str] = []

    def fail(self, why: str) -> ApiError:
        return bad_request(
            f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: {why}'
        )

    def unknown(self, body: Obj, known: tuple[str, ...], path: str) -> None:
        extra = [k for k in body if k not in known]
        if extra and self.strict:
            listed = ", ".join(f'unknown field "{path}.{k}"' for k in extra)
            raise self.fail(f"strict decoding error: {listed}")
        for k in extra:
            self.warnings.append(f'unknown field "{path}.{k}"')
            del body[k]

    def quantity(self, value: Any, *, resource_list: bool = False) -> str:
        """The quantity as stored; ``resource_list``: a ``ResourceList`` value, rounded up to 1m by
        ``SetDefaults_ResourceList``."""
        if value is None:
            return "0"  # UnmarshalJSON of null: the zero Quantity
        try:
            q = parse(json_text(value).strip())
        except QuantityError as exc:
            raise self.fail(str(exc)) from None
        return str(round_up(q) if resource_list else q)


def qualified_name_errors(value: str) -> list[str]:
    """``content.IsLabelKey`` (apimachinery pkg/api/validate/content/kube.go), its messages."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return [
            f"a valid label key {_NAME_RULE} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        ]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _SUBDOMAIN.fullmatch(prefix):
                errs.append("prefix part " + _SUBDOMAIN_RULE)
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _NAME_PART.fullmatch(name):
        errs.append("name part " + _NAME_RULE)
    return errs


def label_value_errors(value: str) -> list[str]:
    """``content.IsLabelValue``."""
    errs = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _LABEL_VALUE.fullmatch(value):
        errs.append(_LABEL_VALUE_RULE)
    return errs


# --- decoding -------------------------------------------------------------------------------------


def _resource_list(d: Decoding, body: Obj, key: str) -> None:
    """A ``ResourceList`` (``map[ResourceName]resource.Quantity``, omitempty): each value re-printed."""
    values = body.get(key)
    if not values:
        body.pop(key, None)
        return
    if not isinstance(values, dict):
        raise d.fail(
            f"json: cannot unmarshal {type(values).__name__} into Go value of type core.ResourceList"
        )
    body[key] = {str(k): d.quantity(v, resource_list=True) for k, v in values.items()}


def _resources(d: Decoding, body: Any, path: str) -> None:
    if not isinstance(body, dict):
        return
    d.unknown(body, RESOURCES_FIELDS, path)
    _resource_list(d, body, "limits")
    _resource_list(d, body, "requests")
    if not body.get("claims"):
        body.pop("claims", None)


def _toleration(d: Decoding, body: Any, path: str) -> None:
    if not isinstance(body, dict):
        return
    d.unknown(body, TOLERATION_FIELDS, path)
    for k in ("key", "operator", "value", "effect"):
        if body.get(k) in ("", None):
            body.pop(k, None)
    if body.get("tolerationSeconds", 0) is None:
        del body["tolerationSeconds"]  # *int64, omitempty: null is nil; 0 stays
    seconds = body.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise d.fail(
            f"json: cannot unmarshal {type(seconds).__name__} into Go struct field "
            f"Toleration.{path.rsplit('.', 1)[0]}.tolerationSeconds of type int64"
        )


def decode_pod_spec(d: Decoding, spec: Any, path: str) -> None:
    """The decode of ``spec`` (at ``path``, e.g. ``spec.template.spec``) in place."""
    if not isinstance(spec, dict):
        return
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(group) or []):
            if isinstance(c, dict) and "resources" in c:
                if c["resources"] is None:
                    c["resources"] = {}  # a struct: null leaves it zero, and it is printed {}
                _resources(d, c["resources"], f"{path}.{group}[{i}].resources")
    if "resources" in spec:
        if spec["resources"] is None:
            del spec["resources"]
        else:
            _resources(d, spec["resources"], f"{path}.resources")
    if "overhead" in spec:
        _resource_list(d, spec, "overhead")
    for i, t in enumerate(spec.get("tolerations") or []):
        _toleration(d, t, f"{path}.tolerations[{i}]")
    for v in spec.get("volumes") or []:
        empty = v.get("emptyDir") if isinstance(v, dict) else None
        if isinstance(empty, dict) and "sizeLimit" in empty:
            if empty["sizeLimit"] is None:
                del empty["sizeLimit"]
            else:
                empty["sizeLimit"] = d.quantity(empty["sizeLimit"])
        claim = ((v.get("ephemeral") or {}).get("volumeClaimTemplate") or {}) if isinstance(v, dict) else {}
        pvc_resources = (claim.get("spec") or {}).get("resources") if isinstance(claim, dict) else None
        if isinstance(pvc_resources, dict):
            for key in ("limits", "requests"):
                _resource_list(d, pvc_resources, key)


# --- validation -----------------------------------------------------------------------------------


def validate_tolerations(tolerations: Any, path: str) -> list[FieldError]:
    """``ValidateTolerations``, in its order and words (the comparison operators' gate off)."""
    errs: list[FieldError] = []
    for i, t in enumerate(tolerations or []):
        if not isinstance(t, Mapping):
            continue
        at = f"{path}[{i}]"
        key, op = str(t.get("key") or ""), str(t.get("operator") or "")
        value, effect = str(t.get("value") or ""), str(t.get("effect") or "")
        if key:
            errs += [
                FieldError(f"{at}.key", "Invalid value", m, key, True) for m in qualified_name_errors(key)
            ]
        if not key and op != "Exists":
            errs.append(
                FieldError(
                    f"{at}.operator",
                    "Invalid value",
                    "operator must be Exists when `key` is empty, which means "
                    '"match all values and all keys"',
                    op,
                    True,
                )
            )
        if t.get("tolerationSeconds") is not None and effect != "NoExecute":
            errs.append(
                FieldError(
                    f"{at}.effect",
                    "Invalid value",
                    "effect must be 'NoExecute' when `tolerationSeconds` is set",
                    effect,
                    True,
                )
            )
        if op in ("Equal", ""):
            problems = label_value_errors(value)
            if problems:
                errs.append(FieldError(f"{at}.operator", "Invalid value", ";".join(problems), value, True))
        elif op == "Exists":
            if value:
                errs.append(
                    FieldError(
                        f"{at}.operator",
                        "Invalid value",
                        "value must be empty when `operator` is 'Exists'",
                        value,
                        True,
                    )
                )
        else:
            supported = ("Equal", "Exists", "Lt", "Gt") if op in ("Lt", "Gt") else ("Equal", "Exists")
            errs.append(
                FieldError(
                    f"{at}.operator",
                    "Unsupported value",
                    "supported values: " + ", ".join(f'"{s}"' for s in supported),
                    op,
                    True,
                )
            )
        if effect and effect not in EFFECTS:
            errs.append(
                FieldError(
                    f"{at}.effect",
                    "Unsupported value",
                    "supported values: " + ", ".join(f'"{s}"' for s in EFFECTS),
                    effect,
                    True,
                )
            )
    return errs


def _native(name: str) -> bool:
    """helper.IsNativeResource: no prefix, or a kubernetes.io/ one."""
    return "/" not in name or "kubernetes.io/" in name


def _extended(name: str) -> bool:
    """helper.IsExtendedResourceName."""
    return (
        not _native(name)
        and not name.startswith("requests.")
        and not qualified_name_errors(f"requests.{name}")
    )


def _container_name_errors(name: str, at: str) -> list[FieldError]:
    """validateContainerResourceName: validateResourceName's errors (a qualified name; without a prefix,
    a standard resource), then its own (without a prefix, a container's; with one, native or extended)."""
    errs = [FieldError(at, "Invalid value", m, name, True) for m in qualified_name_errors(name)]
    standard = name in STANDARD_RESOURCES or name.startswith("requests.hugepages-")
    if not errs and "/" not in name and not standard:
        errs.append(
            FieldError(at, "Invalid value", "must be a standard resource type or fully qualified", name, True)
        )
    if "/" not in name:
        if name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            errs.append(
                FieldError(at, "Invalid value", "must be a standard resource for containers", name, True)
            )
    elif not _native(name) and not _extended(name):
        errs.append(
            FieldError(at, "Invalid value", "doesn't follow extended resource name standard", name, True)
        )
    return errs


def _pod_name_errors(name: str, at: str) -> list[FieldError]:
    """validatePodResourceName: cpu, memory and hugepages only (resourcehelper.SupportedPodLevelResources)."""
    errs = [FieldError(at, "Invalid value", m, name, True) for m in qualified_name_errors(name)]
    if errs or name in ("cpu", "memory") or name.startswith("hugepages-"):
        return errs
    return [FieldError(at, "Unsupported value", 'supported values: "cpu", "memory"', name, True)]


def validate_resources(
    resources: Any, path: str, name_errors: Callable[[str, str], list[FieldError]] = _container_name_errors
) -> list[FieldError]:
    """``validateResourceRequirements`` on decoded (canonical) quantities: limits first, then requests."""
    if not isinstance(resources, Mapping):
        return []
    errs: list[FieldError] = []
    limits: Mapping[str, str] = resources.get("limits") or {}
    requests: Mapping[str, str] = resources.get("requests") or {}
    for part, values in (("limits", limits), ("requests", requests)):
        for name, text in values.items():
            at = f"{path}.{part}[{name}]"
            errs += name_errors(name, at)
            q = parse(text)
            if q.value < 0:
                errs.append(
                    FieldError(at, "Invalid value", "must be greater than or equal to 0", str(q), True)
                )
            integer = name in (
                "pods",
                "quota",
                "services",
                "replicationcontrollers",
                "secrets",
                "configmaps",
                "persistentvolumeclaims",
                "services.nodeports",
                "services.loadbalancers",
            )
            if (integer or _extended(name)) and math.ceil(q.value * 1000) % 1000:  # MilliValue() % 1000
                errs.append(FieldError(at, "Invalid value", "must be an integer", str(q), True))
            if part != "requests":
                continue
            overcommit = _native(name) and not name.startswith("hugepages-")
            if name in limits:
                limit = parse(limits[name])
                if q.value != limit.value and not overcommit:
                    errs.append(
                        FieldError(
                            f"{path}.requests",
                            "Invalid value",
                            f"must be equal to {name} limit of {limit}",
                            str(q),
                            True,
                        )
                    )
                elif q.value > limit.value:
                    errs.append(
                        FieldError(
                            f"{path}.requests",
                            "Invalid value",
                            f"must be less than or equal to {name} limit of {limit}",
                            str(q),
                            True,
                        )
                    )
            elif not overcommit:
                errs.append(
                    FieldError(
                        f"{path}.limits",
                        "Required value",
                        "Limit must be set for non overcommitable resources",
                    )
                )
    return errs


def validate_pod_spec(spec: Any, path: str) -> list[FieldError]:
    """The rules above on a decoded pod spec: each container's resources, the pod's, the tolerations."""
    if not isinstance(spec, Mapping):
        return []
    errs: list[FieldError] = []
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(group) or []):
            if isinstance(c, Mapping):
                errs += validate_resources(c.get("resources"), f"{path}.{group}[{i}].resources")
    if isinstance(spec.get("resources"), Mapping):
        errs += validate_resources(spec["resources"], f"{path}.resources", _pod_name_errors)
    errs += validate_tolerations(spec.get("tolerations"), f"{path}.tolerations")
    errs += validate_host_sysctls(spec, f"{path}.securityContext.sysctls")
    return errs


IPC_SYSCTLS = ("kernel.shm", "kernel.msg", "kernel.sem", "fs.mqueue.")
"""pkg/proxy/util/sysctl (component-helpers/node/util/sysctl) GetNamespace: the IPC namespace's
prefixes; ``net.`` is the network namespace's."""


def validate_host_sysctls(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    """validation.go ``ValidateHostSysctl`` (from validateSysctls): a namespaced sysctl of the host's
    network (``net.*``) or IPC namespace is refused when the pod shares it (``hostNetwork``/``hostIPC``).
    Not modelled: the ratchet that lets an update keep a pod spec that already had one (the emulator
    never stored one)."""
    sc = spec.get("securityContext")
    if not isinstance(sc, Mapping):
        return []
    errs: list[FieldError] = []
    for i, s in enumerate(sc.get("sysctls") or []):
        name = str(s.get("name") or "") if isinstance(s, Mapping) else ""
        dotted = name.replace("/", ".")
        if spec.get("hostNetwork") is True and dotted.startswith("net."):
            shared = "hostNetwork"
        elif spec.get("hostIPC") is True and dotted.startswith(IPC_SYSCTLS):
            shared = "hostIPC"
        else:
            continue
        errs.append(
            FieldError(
                f"{path}[{i}].name",
                "Invalid value",
                f"may not be specified when '{shared}' is true",
                name,
                True,
            )
        )
    return errs


def default_pod_requests(spec: Obj) -> None:
    """SetDefaults_Pod (pkg/apis/core/v1/defaults.go): a container's limit without a request is also its
    request; Pods only, not pod templates."""
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or []:
            res = c.get("resources") if isinstance(c, dict) else None
            if isinstance(res, dict) and res.get("limits"):
                requests = res.setdefault("requests", {})
                for name, value in res["limits"].items():
                    requests.setdefault(name, value)
