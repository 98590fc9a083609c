"""The resource types the emulator serves: built-in kinds and the types a CRD defines (pure data).

A :class:`ResourceType` carries everything the store and the HTTP layer need to know about one resource:
its group/version/plural/kind, scope, subresources, which field selectors the real API server accepts for
it, whether it has ``metadata.generation``, whether a PUT without ``resourceVersion`` is allowed (the
registry strategies' ``AllowUnconditionalUpdate``), and for custom resources the CRD's schema and printer
columns. Storage is keyed by ``(group, plural)``; ``storage`` redirects one API to another's storage
(``events.k8s.io/v1`` events live in the core ``events`` storage, as in Kubernetes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

StorageKey = tuple[str, str]
"""(group, plural): one storage per resource, whatever version it is served at."""

READ_VERBS = ("get", "list", "watch")
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Column:
    """One server-side Table column (a CRD additionalPrinterColumn or a built-in printer column)."""

    name: str
    type: str = "string"
    json_path: str = ""
    format: str = ""
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    """Subresources served: ``status`` (its own write semantics), ``scale``, ``token``."""
    field_selectors: tuple[str, ...] = ()
    """Field selectors beyond metadata.name / metadata.namespace that the real server accepts."""
    has_generation: bool = False
    allow_unconditional_update: bool = True
    allow_create_on_update: bool = False
    """A PUT of a missing object creates it (the strategies' AllowCreateOnUpdate: Leases, Events)."""
    verbs: tuple[str, ...] = ALL_VERBS
    columns: tuple[Column, ...] = ()
    """CRD printer columns (JSONPath); built-ins render theirs in tables.py."""
    crd: str = ""
    """Name of the CRD that defines this type ('' for built-ins)."""
    versions: tuple[str, ...] = ()
    """All served versions (CRDs may serve several; conversion strategy None)."""
    schemas: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """openAPIV3Schema per version (custom resources only)."""
    selectable_fields: tuple[tuple[str, str], ...] = ()
    """CRD spec.versions[].selectableFields: (field selector name, JSONPath)."""
    storage: StorageKey | None = None
    """Another resource's storage this one is a view of (events.k8s.io events -> core events)."""
    virtual: bool = False
    """Create-only review resources (SelfSubjectAccessReview, ...): nothing is stored."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> StorageKey:
        return (self.group, self.plural)

    @property
    def storage_key(self) -> StorageKey:
        return self.storage or self.key

    @property
    def group_resource(self) -> str:
        """``plural.group`` as Kubernetes prints a GroupResource (core: just the plural)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def all_versions(self) -> tuple[str, ...]:
        return self.versions or (self.version,)


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType(group="", version="v1", plural=plural, kind=kind, namespaced=namespaced, **kw)


EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)
POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)

BUILTINS: tuple[ResourceType, ...] = (
    _core(
        "namespaces",
        "Namespace",
        namespaced=False,
        singular="namespace",
        short_names=("ns",),
        subresources=frozenset({"status", "finalize"}),
        field_selectors=("status.phase",),
    ),
    _core("configmaps", "ConfigMap", singular="configmap", short_names=("cm",)),
    _core("endpoints", "Endpoints", singular="endpoints", short_names=("ep",)),
    _core("secrets", "Secret", singular="secret", field_selectors=("type",)),
    _core(
        "serviceaccounts",
        "ServiceAccount",
        singular="serviceaccount",
        short_names=("sa",),
        subresources=frozenset({"token"}),
    ),
    _core(
        "pods",
        "Pod",
        singular="pod",
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status"}),
        field_selectors=POD_FIELDS,
        has_generation=True,
    ),
    _core(
        "nodes",
        "Node",
        namespaced=False,
        singular="node",
        short_names=("no",),
        subresources=frozenset({"status"}),
        field_selectors=("spec.unschedulable",),
    ),
    _core(
        "services",
        "Service",
        singular="service",
        short_names=("svc",),
        categories=("all",),
        subresources=frozenset({"status"}),
    ),
    _core(
        "events",
        "Event",
        singular="event",
        short_names=("ev",),
        field_selectors=EVENT_FIELDS,
        allow_create_on_update=True,
    ),
    ResourceType(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        True,
        singular="event",
        short_names=("ev",),
        field_selectors=EVENT_FIELDS,
        storage=("", "events"),
    ),
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        singular="deployment",
        short_names=("deploy",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
        has_generation=True,
    ),
    *(
        ResourceType("rbac.authorization.k8s.io", "v1", plural, kind, ns, singular=kind.lower())
        for plural, kind, ns in (
            ("roles", "Role", True),
            ("rolebindings", "RoleBinding", True),
            ("clusterroles", "ClusterRole", False),
            ("clusterrolebindings", "ClusterRoleBinding", False),
        )
    ),
    ResourceType(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        True,
        singular="networkpolicy",
        short_names=("netpol",),
        has_generation=True,
    ),
    # The chart's lookup of the API server's endpoints (default/kubernetes), as a cluster serves them.
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, singular="endpointslice"),
    ResourceType(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        True,
        singular="lease",
        allow_unconditional_update=False,
        allow_create_on_update=True,
    ),
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        singular="poddisruptionbudget",
        short_names=("pdb",),
        subresources=frozenset({"status"}),
        has_generation=True,
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        singular="customresourcedefinition",
        short_names=("crd", "crds"),
        categories=("api-extensions",),
        subresources=frozenset({"status"}),
        has_generation=True,
        allow_unconditional_update=False,
    ),
    *(
        ResourceType(group, "v1", plural, kind, ns, singular=kind.lower(), verbs=("create",), virtual=True)
        for group, plural, kind, ns in (
            ("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
            ("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview", False),
            ("authorization.k8s.io", "localsubjectaccessreviews", "LocalSubjectAccessReview", True),
            ("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False),
            ("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", False),
            ("authentication.k8s.io", "tokenreviews", "TokenReview", False),
        )
    ),
)

SUBRESOURCE_KINDS: dict[str, tuple[str, str]] = {
    "token": ("authentication.k8s.io/v1", "TokenRequest"),
    "scale": ("autoscaling/v1", "Scale"),
}
"""Subresources whose body is another kind (apiVersion, kind)."""


class Registry:
    """All served types, looked up by storage key, by (group, version, plural) and by kind."""

    def __init__(self, types: Iterable[ResourceType] = BUILTINS) -> None:
        self._types: dict[StorageKey, ResourceType] = {}
        for t in types:
            self.add(t)

    def add(self, rtype: ResourceType) -> None:
        self._types[rtype.key] = rtype

    def remove(self, key: StorageKey) -> None:
        self._types.pop(key, None)

    def get(self, group: str, plural: str) -> ResourceType | None:
        return self._types.get((group, plural))

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        t = self._types.get((group, plural))
        if t is None or version not in t.all_versions():
            return None
        return t

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for t in self._types.values():
            if t.group == group and t.kind == kind and version in t.all_versions() and not t.virtual:
                return t
        return None

    def by_group_kind(self, group: str, kind: str) -> ResourceType | None:
        for t in self._types.values():
            if t.group == group and t.kind == kind and not t.virtual:
                return t
        return None

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first), core group excluded."""
        out: dict[str, list[str]] = {}
        for t in self._types.values():
            if not t.group:
                continue
            vs = out.setdefault(t.group, [])
            for v in t.all_versions():
                if v not in vs:
                    vs.append(v)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self._types.values() if t.group == group and version in t.all_versions()]


def crd_resource_type(crd: Mapping[str, Any]) -> ResourceType:
    """The type a CustomResourceDefinition serves (first served version is the preferred one)."""
    spec: Mapping[str, Any] = crd["spec"]
    names: Mapping[str, Any] = spec["names"]
    versions: list[Mapping[str, Any]] = [v for v in spec.get("versions", []) if v.get("served", True)]
    fallback: Mapping[str, Any] = versions[0] if versions else {"name": "v1"}
    storage: Mapping[str, Any] = next((v for v in versions if v.get("storage")), fallback)
    columns = tuple(
        Column(
            name=c["name"],
            type=c.get("type", "string"),
            json_path=c.get("jsonPath", ""),
            format=c.get("format", ""),
            description=c.get("description", ""),
            priority=int(c.get("priority", 0)),
        )
        for c in storage.get("additionalPrinterColumns", [])
    )
    subresources = frozenset(k for k in (storage.get("subresources") or {}) if k in ("status", "scale"))
    schemas = {v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in versions}
    selectable = tuple(
        (f["jsonPath"].lstrip("."), f["jsonPath"]) for f in storage.get("selectableFields", []) or []
    )
    return ResourceType(
        group=spec["group"],
        version=(versions[0]["name"] if versions else storage["name"]),
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        singular=names.get("singular", names["kind"].lower()),
        short_names=tuple(names.get("shortNames", []) or []),
        categories=tuple(names.get("categories", []) or []),
        subresources=subresources,
        field_selectors=tuple(s for s, _ in selectable),
        has_generation=True,
        allow_unconditional_update=False,
        columns=columns,
        crd=crd["metadata"]["name"],
        versions=tuple(v["name"] for v in versions),
        schemas=schemas,
        selectable_fields=selectable,
    )
