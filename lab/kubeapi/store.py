"""The emulator's data model: objects, one cluster-wide resourceVersion, a bounded event history, watchers,
finalizers, ownerReference garbage collection and namespace/CRD cleanup.

Everything here is synchronous and does no I/O: the HTTP layer calls it from one event loop, so every
method runs atomically (no locks; a watch registers and replays in the same step as its snapshot). Stored
objects are never mutated in place: a write builds a new dict, so watch events and responses can share them.

Faithful where controllers depend on it: resourceVersion is one increasing integer over all kinds (etcd's
revision), a write that changes nothing is not a write (no new resourceVersion, no event), generation
moves only with spec-like changes, a stale resourceVersion is a 409, finalizers hold a deletion, the
garbage collector deletes dependents whose owners are all gone (Background/Foreground/Orphan), watch
events after a resourceVersion come from the history or end in 410 Expired once it was compacted, and
watch selectors turn label changes into ADDED/DELETED as the watch cache does.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from lab.kubeapi import kinds, podsecurity, podspec
from lab.kubeapi.errors import (
    ApiError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    gone,
    invalid,
    namespace_not_found,
    not_found,
    patch_failed,
    stale,
    unsupported_media_type,
)
from lab.kubeapi.patch import PatchError, apply_merge, json_patch, merge_patch, strategic_merge
from lab.kubeapi.resources import Registry, ResourceType, StorageKey, crd_resource_type
from lab.kubeapi.selectors import FieldSelector, LabelSelector, match_fields, match_labels

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Ident = tuple[str, str]
"""(namespace, name); namespace '' for cluster-scoped objects."""

NS_KEY: StorageKey = ("", "namespaces")
CRD_KEY: StorageKey = ("apiextensions.k8s.io", "customresourcedefinitions")
POD_SPECS: dict[StorageKey, tuple[str, ...]] = {
    ("", "pods"): ("spec",),
    ("apps", "deployments"): ("spec", "template", "spec"),
}
"""Where the built-in kinds the emulator serves carry a pod spec (``lab.kubeapi.podspec``)."""
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)

Validator = Callable[[ResourceType, str, dict[str, Any], "Mapping[str, Any] | None", str], list[str]]
"""(type, version, object to admit (may be defaulted/pruned in place), old object, fieldValidation) ->
warnings; raises ApiError (422) when the object is invalid."""


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Event:
    type: EventType
    rv: int
    key: StorageKey
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass
class Watcher:
    """One watch: its filter and where its events go (``push`` must not block)."""

    rtype: ResourceType
    namespace: str
    labels: LabelSelector
    fields: FieldSelector
    push: Callable[[str, dict[str, Any]], None]
    closed: bool = False

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return match_labels(self.labels, obj) and match_fields(self.fields, obj, self.rtype)

    def offer(self, ev: Event) -> None:
        """The watch cache's rule: moving into the selection is ADDED, moving out is DELETED (carrying the
        previous content with the new resourceVersion)."""
        if self.closed:
            return
        if ev.type == "DELETED":
            if self.matches(ev.obj):
                self.push("DELETED", ev.obj)
            return
        cur = self.matches(ev.obj)
        old = ev.prev is not None and self.matches(ev.prev)
        if ev.type == "ADDED":
            if cur:
                self.push("ADDED", ev.obj)
        elif cur and old:
            self.push("MODIFIED", ev.obj)
        elif cur:
            self.push("ADDED", ev.obj)
        elif old and ev.prev is not None:
            gone_obj = dict(ev.prev)
            gone_obj["metadata"] = {**ev.prev["metadata"], "resourceVersion": str(ev.rv)}
            self.push("DELETED", gone_obj)


@dataclass(frozen=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str = ""
    remaining: int | None = None


@dataclass
class DeleteOptions:
    propagation: str = ""
    uid: str = ""
    resource_version: str = ""
    dry_run: bool = False
    grace_seconds: int | None = None


@dataclass
class Stats:
    writes: int = 0
    events: int = 0
    gc_deletions: int = 0


Mutator = Callable[[tuple[str, str], dict[str, Any]], None]
"""A mutating admission hook: (group, plural) and the object, changed in place."""


@dataclass
class Store:
    """All objects of the emulated cluster."""

    registry: Registry = field(default_factory=Registry)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    history_size: int = 10000
    validator: Validator | None = None
    on_change: Callable[[], None] = field(default=lambda: None)
    on_types_changed: Callable[[], None] = field(default=lambda: None)
    pod_security: bool = True
    """The PodSecurity admission plugin (lab.kubeapi.podsecurity), on by default as in kube-apiserver."""

    def __post_init__(self) -> None:
        self.objects: dict[StorageKey, dict[Ident, dict[str, Any]]] = {}
        self.rv = 0
        self.history: deque[Event] = deque()
        self.compacted_rv = 0
        self.watchers: dict[StorageKey, set[int]] = {}
        self._watchers: dict[int, Watcher] = {}
        self.applied: dict[str, dict[str, Any]] = {}
        self.by_uid: dict[str, tuple[StorageKey, Ident]] = {}
        self.dependents: dict[str, set[str]] = {}
        self._gc_check: set[str] = set()
        self._gc_owners: set[str] = set()
        self.stats = Stats()
        self.mutators: list[Mutator] = []
        """Mutating admission (as a webhook would): each called with the resource's (group, plural) and
        the object on every create and update, after defaulting and before validation (kube-apiserver's
        order: mutating admission, then validation; k8s.io/apiserver pkg/endpoints/handlers/create.go)."""
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create(self.rtype("", "namespaces"), "", {"metadata": {"name": name}})

    # --- lookups ------------------------------------------------------------------------------------

    def rtype(self, group: str, plural: str) -> ResourceType:
        t = self.registry.get(group, plural)
        if t is None:
            raise KeyError((group, plural))
        return t

    def now(self) -> str:
        return rfc3339(self.clock())

    def _objs(self, rtype: ResourceType) -> dict[Ident, dict[str, Any]]:
        return self.objects.setdefault(rtype.storage_key, {})

    def _ident(self, rtype: ResourceType, ns: str, name: str) -> Ident:
        return (ns if rtype.namespaced else "", name)

    def peek(self, rtype: ResourceType, ns: str, name: str) -> dict[str, Any] | None:
        """The stored object (storage form) or None."""
        return self._objs(rtype).get(self._ident(rtype, ns, name))

    def get(self, rtype: ResourceType, ns: str, name: str, version: str = "") -> dict[str, Any]:
        obj = self.peek(rtype, ns, name)
        if obj is None:
            raise not_found(rtype, name)
        return self.view(rtype, obj, version)

    def view(self, rtype: ResourceType, obj: dict[str, Any], version: str = "") -> dict[str, Any]:
        """The stored object as the API version ``rtype``/``version`` serves it."""
        if rtype.storage is not None and rtype.key == ("events.k8s.io", "events"):
            return kinds.event_to_v1beta(obj)
        api_version = (
            f"{rtype.group}/{version or rtype.version}" if rtype.group else (version or rtype.version)
        )
        if obj.get("apiVersion") != api_version and rtype.crd:
            return {**obj, "apiVersion": api_version}
        return obj

    def _to_storage(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if rtype.storage is not None and rtype.key == ("events.k8s.io", "events"):
            return kinds.event_to_core(obj)
        return obj

    def _incoming(self, rtype: ResourceType, version: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A request body checked against the served kind and version, in storage form."""
        obj = copy.deepcopy(dict(body))
        self._check_type(rtype, version, obj)
        return self._to_storage(rtype, obj)

    def namespace_exists(self, name: str) -> bool:
        return ("", name) in self.objects.get(NS_KEY, {})

    def items(self, key: StorageKey) -> Iterable[dict[str, Any]]:
        return self.objects.get(key, {}).values()

    def count(self) -> int:
        return sum(len(v) for v in self.objects.values())

    # --- commit: the one place that writes ------------------------------------------------------------

    def _commit(
        self, rtype: ResourceType, ident: Ident, new: dict[str, Any] | None, etype: EventType
    ) -> dict[str, Any]:
        objs = self._objs(rtype)
        prev = objs.get(ident)
        self.rv += 1
        rv = str(self.rv)
        if etype == "DELETED":
            assert prev is not None
            obj = {**prev, "metadata": {**prev["metadata"], "resourceVersion": rv}}
            del objs[ident]
            uid = prev["metadata"].get("uid", "")
            self.by_uid.pop(uid, None)
            self.applied.pop(uid, None)
            self._index_owners(uid, prev, None)
            self._gc_check.update(self.dependents.get(uid, ()))
            self._requeue_after_delete(rtype, prev)
        else:
            assert new is not None
            new["metadata"]["resourceVersion"] = rv
            obj = new
            objs[ident] = obj
            uid = obj["metadata"]["uid"]
            self.by_uid[uid] = (rtype.storage_key, ident)
            self._index_owners(uid, prev, obj)
        ev = Event(etype, self.rv, rtype.storage_key, obj, prev)
        self.history.append(ev)
        while len(self.history) > self.history_size:
            self.compacted_rv = self.history.popleft().rv
        self.stats.writes += 1
        for wid in list(self.watchers.get(rtype.storage_key, ())):
            w = self._watchers.get(wid)
            if w is not None:
                w.offer(ev)
        self.on_change()
        return obj

    def _requeue_after_delete(self, rtype: ResourceType, prev: Mapping[str, Any]) -> None:
        """A deletion may unblock a foreground owner, a terminating namespace or a CRD's cleanup."""
        meta = prev.get("metadata") or {}
        for r in meta.get("ownerReferences") or []:
            if r.get("uid") in self.by_uid:
                self._gc_owners.add(r["uid"])
        ns = meta.get("namespace")
        if ns:
            nso = self.objects.get(NS_KEY, {}).get(("", ns))
            if nso is not None and nso["metadata"].get("deletionTimestamp"):
                self._gc_owners.add(nso["metadata"]["uid"])
        if rtype.crd:
            crd = self.objects.get(CRD_KEY, {}).get(("", rtype.crd))
            if crd is not None and crd["metadata"].get("deletionTimestamp"):
                self._gc_owners.add(crd["metadata"]["uid"])

    def _index_owners(self, uid: str, prev: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        old_refs = {
            r.get("uid", "") for r in ((prev or {}).get("metadata") or {}).get("ownerReferences") or []
        }
        new_refs = {
            r.get("uid", "") for r in ((new or {}).get("metadata") or {}).get("ownerReferences") or []
        }
        for o in old_refs - new_refs:
            deps = self.dependents.get(o)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self.dependents[o]
        for o in new_refs - old_refs:
            self.dependents.setdefault(o, set()).add(uid)
        if new_refs and new_refs != old_refs:
            self._gc_check.add(uid)

    # --- create ---------------------------------------------------------------------------------------

    def _check_namespace(self, rtype: ResourceType, ns: str, name: str, creating: bool) -> None:
        if not rtype.namespaced:
            return
        nso = self.objects.get(NS_KEY, {}).get(("", ns))
        if nso is None:
            raise namespace_not_found(ns)
        if creating and nso["metadata"].get("deletionTimestamp"):
            err = forbidden(
                rtype.group,
                rtype.plural,
                name,
                f"unable to create new content in namespace {ns} because it is being terminated",
            )
            assert err.details is not None
            err.details["causes"] = [
                {
                    "reason": "NamespaceTerminating",
                    "message": f"namespace {ns} is being terminated",
                    "field": "metadata.namespace",
                }
            ]
            raise err

    def _check_type(self, rtype: ResourceType, version: str, body: dict[str, Any]) -> None:
        want = f"{rtype.group}/{version or rtype.version}" if rtype.group else (version or rtype.version)
        av, kind = body.get("apiVersion"), body.get("kind")
        if av and av != want:
            raise bad_request(
                f"the API version in the data ({av}) does not match the expected API version ({want})"
            )
        if kind and kind != rtype.kind:
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({rtype.kind})"
            )
        body["apiVersion"], body["kind"] = want, rtype.kind

    def create(
        self,
        rtype: ResourceType,
        ns: str,
        body: Mapping[str, Any],
        *,
        version: str = "",
        dry_run: bool = False,
        field_manager: str = "",
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        obj = self._incoming(rtype, version, body)
        if not isinstance(obj.get("metadata", {}), dict):
            raise bad_request("metadata must be an object")
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        name = meta.get("name") or ""
        if not name:
            if not meta.get("generateName"):
                raise invalid(
                    rtype,
                    "",
                    [FieldError("metadata.name", "Required value", "name or generateName is required")],
                )
            for _ in range(100):
                name = meta["generateName"] + "".join(
                    secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
                )
                if self.peek(rtype, ns, name) is None:
                    break
            meta["name"] = name
        errs = kinds.validate_name(rtype, name) + kinds.validate_labels(meta)
        if errs:
            raise invalid(rtype, name, errs)
        self._check_namespace(rtype, ns, name, creating=True)
        if self.peek(rtype, ns, name) is not None:
            raise already_exists(rtype, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.now()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(k, None)
        if rtype.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rtype.has_status:
            status = kinds.initial_status(rtype)
            if status is None:
                obj.pop("status", None)
            else:
                obj["status"] = status
        self._admit(rtype, version, obj, None, field_validation, warnings)
        self._pod_security(rtype, obj, None, "", warnings)
        if dry_run:
            return self.view(rtype, obj, version)
        stored = self._commit(rtype, self._ident(rtype, ns, name), obj, "ADDED")
        self._after_write(rtype, None, stored)
        return self.view(rtype, stored, version)

    def _admit(
        self,
        rtype: ResourceType,
        version: str,
        obj: dict[str, Any],
        old: Mapping[str, Any] | None,
        field_validation: str,
        warnings: list[str] | None,
    ) -> None:
        """Kind strategies, then (custom resources) schema validation and defaulting."""
        name = obj["metadata"].get("name", "")
        errs: list[FieldError] = []
        spec_path = POD_SPECS.get(rtype.key)
        spec: Any = None
        if spec_path is not None:  # decoded into the Go types first (quantities, tolerations)
            spec = obj
            for step in spec_path:
                spec = spec.get(step) if isinstance(spec, dict) else None
            decoding = podspec.Decoding(rtype.kind, version or rtype.version, field_validation == "Strict")
            podspec.decode_pod_spec(decoding, spec, ".".join(spec_path))
            if warnings is not None:
                warnings.extend(decoding.warnings)
        if rtype.key == kinds.LEASE_KEY:
            kinds.decode_lease(obj, version or rtype.version)
        kinds.apply_defaults(rtype, obj)
        for mutate in self.mutators:
            mutate(rtype.key, obj)
        if spec_path is not None:
            errs += podspec.validate_pod_spec(spec, ".".join(spec_path))
        if rtype.key == ("", "secrets"):
            errs += kinds.fold_secret(obj)
        if rtype.key == ("", "configmaps"):
            errs += kinds.validate_config_map(obj)
        if rtype.key == kinds.LEASE_KEY:
            errs += kinds.validate_lease(obj)
        if rtype.key == ("", "events") and old is None:
            errs += kinds.validate_event_namespace(obj)
        if old is not None:
            errs += kinds.immutable_violation(rtype, old, obj)
        if rtype.key == CRD_KEY:
            errs += kinds.validate_crd(obj)
            if not errs:
                obj["status"] = kinds.crd_status(obj, self.now(), old)
        if rtype.key == NS_KEY:
            obj["status"] = {"phase": "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"}
        if errs:
            raise invalid(rtype, name, errs)
        if rtype.crd and self.validator is not None:
            w = self.validator(rtype, version or rtype.version, obj, old, field_validation)
            if warnings is not None:
                warnings.extend(w)

    def _pod_security(
        self,
        rtype: ResourceType,
        obj: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        subresource: str,
        warnings: list[str] | None,
    ) -> None:
        """The PodSecurity validating admission plugin, after the object's own validation (a validating
        plugin runs in the registry's createValidation/updateValidation, after the strategy's Validate:
        apiserver pkg/registry/generic/registry/store.go Create, Update): a Pod the namespace's enforce
        level refuses is a 403; the warn level's verdict is a warning (k8s.io/pod-security-admission
        admission/admission.go ValidatePod, ValidatePodController)."""
        if not self.pod_security or not rtype.namespaced:
            return
        if rtype.key == ("", "pods"):
            if subresource not in ("", "ephemeralcontainers"):
                return  # ignoredPodSubresources (status, binding, eviction, ...)
            if old is not None and not podsecurity.significant_update(obj, old):
                return
            meta, spec, enforce = obj.get("metadata") or {}, obj.get("spec") or {}, True
        elif rtype.key in podsecurity.POD_CONTROLLERS and not subresource:
            template: Any = obj
            for step in podsecurity.POD_CONTROLLERS[rtype.key]:
                template = template.get(step) if isinstance(template, Mapping) else None
            if not isinstance(template, Mapping):
                return
            meta, spec, enforce = template.get("metadata") or {}, template.get("spec") or {}, False
        else:
            return
        nso = self.objects.get(NS_KEY, {}).get(("", obj["metadata"].get("namespace", "")))
        labels = (nso or {}).get("metadata", {}).get("labels") or {}
        if enforce:
            refused = podsecurity.refusal(labels, meta, spec)
            if refused:
                raise forbidden("", "pods", obj["metadata"].get("name", ""), refused)
        said = podsecurity.warning(labels, meta, spec)
        if said and warnings is not None:
            warnings.append(said)

    def _after_write(
        self, rtype: ResourceType, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        if rtype.key == CRD_KEY:
            if new is not None and not new["metadata"].get("deletionTimestamp"):
                self.registry.add(crd_resource_type(new))
            elif new is None and old is not None:
                spec = old["spec"]
                self.registry.remove((spec["group"], spec["names"]["plural"]))
                self.objects.pop((spec["group"], spec["names"]["plural"]), None)
            self.on_types_changed()

    # --- update / patch -------------------------------------------------------------------------------

    def update(
        self,
        rtype: ResourceType,
        ns: str,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str = "",
        version: str = "",
        dry_run: bool = False,
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """PUT: ``metadata.resourceVersion`` is a precondition (required where the strategy says so)."""
        self._check_namespace(rtype, ns, name, creating=False)
        old = self.peek(rtype, ns, name)
        if old is None:
            raise not_found(rtype, name)
        new = self._incoming(rtype, version, body)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if rtype.namespaced and meta.get("namespace") and meta["namespace"] != ns:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        rv = str(meta.get("resourceVersion") or "")
        if not rv and not rtype.allow_unconditional_update and subresource != "status":
            raise invalid(
                rtype,
                name,
                [
                    FieldError(
                        "metadata.resourceVersion",
                        "Invalid value",
                        "must be specified for an update",
                        raw="0x0",
                    )
                ],
            )
        return self._replace(rtype, old, new, rv, subresource, version, dry_run, field_validation, warnings)

    def _replace(
        self,
        rtype: ResourceType,
        old: dict[str, Any],
        new: dict[str, Any],
        rv: str,
        subresource: str,
        version: str,
        dry_run: bool,
        field_validation: str,
        warnings: list[str] | None,
    ) -> dict[str, Any]:
        name = old["metadata"]["name"]
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise stale(rtype, name)
        uid = (new.get("metadata") or {}).get("uid")
        if uid and uid != old["metadata"]["uid"]:
            raise conflict(
                rtype,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{old['metadata']['uid']}",
            )
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            meta = new.setdefault("metadata", {})
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "name",
                "namespace",
            ):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            meta.pop("managedFields", None)
            meta.pop("selfLink", None)
            if rtype.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            errs = kinds.validate_labels(meta)
            if old["metadata"].get("deletionTimestamp"):
                added = [
                    f
                    for f in meta.get("finalizers") or []
                    if f not in (old["metadata"].get("finalizers") or [])
                ]
                if added:
                    errs.append(
                        FieldError(
                            "metadata.finalizers",
                            "Forbidden",
                            "no new finalizers can be added if the object is being deleted, found "
                            "new finalizers "
                            "[]string{" + ", ".join(json.dumps(f) for f in added) + "}",
                        )
                    )
            if errs:
                raise invalid(rtype, name, errs)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        self._admit(rtype, version, new, old, field_validation, warnings)
        self._pod_security(rtype, new, old, subresource, warnings)
        if subresource != "status" and rtype.has_generation and _spec_changed(old, new, rtype.has_status):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if new == old:
            return self.view(rtype, old, version)  # a no-op write: no new resourceVersion, no event
        if dry_run:
            return self.view(rtype, new, version)
        ident = self._ident(rtype, old["metadata"].get("namespace", ""), name)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._objs(rtype)[ident] = new
            gone_obj = self._commit(rtype, ident, None, "DELETED")
            self._after_write(rtype, old, None)
            return self.view(rtype, gone_obj, version)
        stored = self._commit(rtype, ident, new, "MODIFIED")
        self._after_write(rtype, old, stored)
        return self.view(rtype, stored, version)

    def patch(
        self,
        rtype: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str = "",
        version: str = "",
        dry_run: bool = False,
        field_manager: str = "",
        field_validation: str = "",
        warnings: list[str] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """PATCH in one of the four formats; returns (object, created) - apply may create."""
        if content_type not in PATCH_TYPES:
            raise unsupported_media_type(content_type, PATCH_TYPES)
        if content_type == "application/strategic-merge-patch+json" and rtype.crd:
            raise unsupported_media_type(
                content_type,
                (
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                ),
            )
        self._check_namespace(rtype, ns, name, creating=False)
        old = self.peek(rtype, ns, name)
        if content_type == "application/apply-patch+yaml":
            return self._apply(
                rtype,
                ns,
                name,
                old,
                patch,
                subresource,
                version,
                dry_run,
                field_manager,
                field_validation,
                warnings,
            )
        if old is None:
            raise not_found(rtype, name)
        current = self.view(rtype, old, version)
        try:
            if content_type == "application/json-patch+json":
                patched = json_patch(current, patch)
            elif content_type == "application/merge-patch+json":
                if not isinstance(patch, dict):
                    raise bad_request(
                        "error decoding patch: json: cannot unmarshal array into Go value of type "
                        "map[string]interface {}"
                    )
                patched = merge_patch(current, patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request(
                        "error decoding patch: json: cannot unmarshal array into Go value of type "
                        "map[string]interface {}"
                    )
                patched = strategic_merge(current, patch)
        except PatchError as e:
            raise patch_failed(str(e)) from None
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise bad_request("the patched object is not a Kubernetes object")
        rv = str(patched["metadata"].get("resourceVersion") or "")
        new = self._incoming(rtype, version, patched)
        new.setdefault("metadata", {})["name"] = name
        return self._replace(
            rtype, old, new, rv, subresource, version, dry_run, field_validation, warnings
        ), False

    def _apply(
        self,
        rtype: ResourceType,
        ns: str,
        name: str,
        old: dict[str, Any] | None,
        config: Any,
        subresource: str,
        version: str,
        dry_run: bool,
        field_manager: str,
        field_validation: str,
        warnings: list[str] | None,
    ) -> tuple[dict[str, Any], bool]:
        if not field_manager:
            raise bad_request("PATCH, application/apply-patch+yaml requires fieldManager to be set")
        if not isinstance(config, dict) or not config.get("apiVersion") or not config.get("kind"):
            raise bad_request("error decoding YAML: the applied configuration must have apiVersion and kind")
        cmeta = config.get("metadata") or {}
        if cmeta.get("name") and cmeta["name"] != name:
            raise bad_request(
                f"the name of the object ({cmeta['name']}) does not match the name on the URL ({name})"
            )
        manager = f"__apply__:{field_manager}:{subresource}"
        schema = (rtype.schemas or {}).get(version or rtype.version) or None
        if old is None:
            if subresource:
                raise not_found(rtype, name)
            body = copy.deepcopy(config)
            body.setdefault("metadata", {})["name"] = name
            created = self.create(
                rtype,
                ns,
                body,
                version=version,
                dry_run=dry_run,
                field_validation=field_validation,
                warnings=warnings,
            )
            if not dry_run:
                self.applied.setdefault(created["metadata"]["uid"], {})[manager] = _applied_record(config)
            return created, True
        current = self.view(rtype, old, version)
        uid = old["metadata"]["uid"]
        previous = self.applied.get(uid, {}).get(manager, {})
        merged = apply_merge(current, _strip_meta(config), _strip_meta(previous), schema)
        merged["metadata"] = apply_merge(
            current.get("metadata") or {},
            _apply_meta(cmeta),
            _apply_meta((previous or {}).get("metadata") or {}),
        )
        rv = str(cmeta.get("resourceVersion") or "")
        new = self._incoming(rtype, version, merged)
        new["metadata"]["name"] = name
        out = self._replace(rtype, old, new, rv, subresource, version, dry_run, field_validation, warnings)
        if not dry_run:
            self.applied.setdefault(uid, {})[manager] = _applied_record(config)
        return out, False

    # --- delete -----------------------------------------------------------------------------------------

    def delete(
        self, rtype: ResourceType, ns: str, name: str, opts: DeleteOptions | None = None
    ) -> dict[str, Any]:
        """DELETE: immediate unless finalizers (or a Foreground/Orphan policy) hold the object."""
        opts = opts or DeleteOptions()
        self._check_namespace(rtype, ns, name, creating=False)
        old = self.peek(rtype, ns, name)
        if old is None:
            raise not_found(rtype, name)
        meta = old["metadata"]
        if opts.uid and opts.uid != meta["uid"]:
            raise conflict(
                rtype,
                name,
                f"Precondition failed: UID in precondition: {opts.uid}, UID in object meta: {meta['uid']}",
            )
        if opts.resource_version and opts.resource_version != meta["resourceVersion"]:
            raise conflict(
                rtype,
                name,
                f"Precondition failed: ResourceVersion in precondition: {opts.resource_version}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if opts.propagation and opts.propagation not in ("Background", "Foreground", "Orphan"):
            raise invalid(
                rtype,
                name,
                [
                    FieldError(
                        "propagationPolicy",
                        "Unsupported value",
                        'supported values: "Foreground", "Background", "Orphan", "nil"',
                        opts.propagation,
                        True,
                    )
                ],
            )
        finalizers = list(meta.get("finalizers") or [])
        policy_finalizer = {"Foreground": FOREGROUND, "Orphan": ORPHAN}.get(opts.propagation)
        if rtype.key == NS_KEY and "kubernetes" in ((old.get("spec") or {}).get("finalizers") or []):
            policy_finalizer = None
            finalizers_held = True
        elif rtype.key == CRD_KEY:
            if CRD_CLEANUP not in finalizers:
                finalizers.append(CRD_CLEANUP)
            finalizers_held = True
        else:
            finalizers_held = False
        if policy_finalizer:
            for f in (FOREGROUND, ORPHAN):
                if f in finalizers and f != policy_finalizer:
                    finalizers.remove(f)
            if policy_finalizer not in finalizers:
                finalizers.append(policy_finalizer)
        if opts.dry_run:
            return self.view(rtype, old)
        if finalizers or finalizers_held:
            if meta.get("deletionTimestamp") and finalizers == list(meta.get("finalizers") or []):
                return self.view(rtype, old)  # already being deleted
            new = copy.deepcopy(old)
            nm = new["metadata"]
            if not nm.get("deletionTimestamp"):
                nm["deletionTimestamp"] = self.now()
                nm["deletionGracePeriodSeconds"] = 0
                if rtype.has_generation:
                    nm["generation"] = int(nm.get("generation", 1)) + 1
            if finalizers:
                nm["finalizers"] = finalizers
            if rtype.key == NS_KEY:
                new["status"] = {"phase": "Terminating"}
            stored = self._commit(rtype, self._ident(rtype, ns, name), new, "MODIFIED")
            if policy_finalizer or rtype.key in (NS_KEY, CRD_KEY):
                self._gc_owners.add(nm["uid"])
            self._after_write(rtype, old, stored)
            return self.view(rtype, stored)
        gone_obj = self._commit(rtype, self._ident(rtype, ns, name), None, "DELETED")
        self._after_write(rtype, old, None)
        return self.view(rtype, gone_obj)

    # --- list / watch ------------------------------------------------------------------------------------

    def select(
        self, rtype: ResourceType, ns: str, labels: LabelSelector, fields: FieldSelector
    ) -> Iterator[tuple[Ident, dict[str, Any]]]:
        objs = self.objects.get(rtype.storage_key, {})
        for ident in sorted(objs):
            if ns and ident[0] != ns:
                continue
            obj = objs[ident]
            if labels and not match_labels(labels, obj):
                continue
            if fields and not match_fields(fields, obj, rtype):
                continue
            yield ident, obj

    def list(
        self,
        rtype: ResourceType,
        ns: str,
        labels: LabelSelector = (),
        fields: FieldSelector = (),
        *,
        limit: int = 0,
        continue_token: str = "",
        version: str = "",
        resource_version: str = "",
        resource_version_match: str = "",
    ) -> ListResult:
        list_rv = self.rv
        start: Ident | None = None
        if continue_token:
            try:
                tok = json.loads(base64.urlsafe_b64decode(continue_token.encode() + b"=="))
                list_rv, start = int(tok["rv"]), (str(tok["start"][0]), str(tok["start"][1]))
            except (ValueError, KeyError, TypeError, IndexError):
                # The real server's words, up to the decoder's own (kube-apiserver v1.35.4, storage/etcd3).
                raise bad_request(
                    "invalid continue token: continue key is not valid: illegal base64 data"
                ) from None
            if list_rv < self.compacted_rv:
                raise gone(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start "
                    "a new list without the continue parameter, or use the continue token in this "
                    "response to "
                    "retrieve the remainder of the results. Continuing with the provided token results in an "
                    "inconsistent list - objects that were created, modified, or deleted between the "
                    "time the first "
                    "chunk was returned and now may show up in the list."
                )
        elif resource_version and resource_version_match == "Exact" and resource_version != str(self.rv):
            if _int(resource_version) < self.compacted_rv:
                raise gone(f"too old resource version: {resource_version} ({self.compacted_rv})")
        elif resource_version and resource_version != "0" and _int(resource_version) > self.rv:
            raise self._too_large(resource_version)
        items: list[dict[str, Any]] = []
        matched = self.select(rtype, ns, labels, fields)
        remaining = 0
        last: Ident | None = None
        for ident, obj in matched:
            if start is not None and ident <= start:
                continue
            if limit and len(items) >= limit:
                remaining += 1
                continue
            items.append(self.view(rtype, obj, version))
            last = ident
        token = ""
        if limit and remaining and last is not None:
            token = (
                base64.urlsafe_b64encode(json.dumps({"rv": list_rv, "start": list(last)}).encode())
                .decode()
                .rstrip("=")
            )
        return ListResult(
            items,
            str(list_rv),
            token,
            remaining if token and not labels and not fields else None,
        )

    def _too_large(self, resource_version: str) -> ApiError:
        """What the watch cache answers (after waiting 3 s) for a resourceVersion it has not reached."""
        return ApiError(
            504,
            "Timeout",
            f"Too large resource version: {resource_version}, current: {self.rv}",
            {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )

    def watch(
        self,
        rtype: ResourceType,
        ns: str,
        labels: LabelSelector,
        fields: FieldSelector,
        push: Callable[[str, dict[str, Any]], None],
        *,
        resource_version: str = "",
        send_initial_events: bool = False,
    ) -> Watcher:
        """Register a watcher; initial events are pushed before this returns (atomically with the snapshot).
        Raises 410 Expired (as an ApiError) when ``resource_version`` was compacted away."""
        w = Watcher(rtype, ns, labels, fields, push)
        if send_initial_events or resource_version in ("", "0"):
            for _, obj in self.select(rtype, ns, labels, fields):
                push("ADDED", obj)
            if send_initial_events:
                push("INITIAL-END", {})
        else:
            n = _int(resource_version)
            if n < self.compacted_rv:
                raise gone(f"too old resource version: {n} ({self.compacted_rv})")
            if n > self.rv:
                raise self._too_large(resource_version)
            for ev in self.history:
                if ev.rv > n and ev.key == rtype.storage_key:
                    w.offer(ev)
        wid = id(w)
        self._watchers[wid] = w
        self.watchers.setdefault(rtype.storage_key, set()).add(wid)
        return w

    def unwatch(self, w: Watcher) -> None:
        w.closed = True
        self._watchers.pop(id(w), None)
        self.watchers.get(w.rtype.storage_key, set()).discard(id(w))

    def watcher_count(self) -> int:
        return len(self._watchers)

    def compact(self) -> int:
        """Drop the whole event history: every watch from an older resourceVersion now gets 410."""
        self.history.clear()
        self.compacted_rv = self.rv
        return self.rv

    # --- garbage collector, namespace and CRD cleanup -----------------------------------------------------

    def _lookup_owner(
        self, dep: Mapping[str, Any], ref: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """('solid'|'absent'|'unresolvable', owner)."""
        api_version = str(ref.get("apiVersion", ""))
        group = api_version.rpartition("/")[0]
        rtype = self.registry.by_group_kind(group, str(ref.get("kind", "")))
        if rtype is None:
            return "unresolvable", None
        dep_ns = (dep.get("metadata") or {}).get("namespace", "")
        if rtype.namespaced and not dep_ns:
            return "unresolvable", None  # a cluster-scoped dependent cannot have a namespaced owner
        owner = self.peek(rtype, dep_ns, str(ref.get("name", "")))
        if owner is None or owner["metadata"]["uid"] != ref.get("uid"):
            return "absent", None
        return "solid", owner

    def _by_uid(self, uid: str) -> tuple[ResourceType, dict[str, Any]] | None:
        loc = self.by_uid.get(uid)
        if loc is None:
            return None
        key, ident = loc
        obj = self.objects.get(key, {}).get(ident)
        rtype = self.registry.get(*key)
        if obj is None or rtype is None:
            return None
        return rtype, obj

    def _set_meta(self, rtype: ResourceType, obj: dict[str, Any], **changes: Any) -> None:
        new = copy.deepcopy(obj)
        for k, v in changes.items():
            if v is None:
                new["metadata"].pop(k, None)
            else:
                new["metadata"][k] = v
        meta = new["metadata"]
        ident = self._ident(rtype, meta.get("namespace", ""), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._objs(rtype)[ident] = new
            self._commit(rtype, ident, None, "DELETED")
            self._after_write(rtype, obj, None)
        else:
            stored = self._commit(rtype, ident, new, "MODIFIED")
            self._after_write(rtype, obj, stored)

    def _remove_finalizer(self, rtype: ResourceType, obj: dict[str, Any], name: str) -> None:
        fins = [f for f in obj["metadata"].get("finalizers") or [] if f != name]
        self._set_meta(rtype, obj, finalizers=fins or None)

    def gc_pending(self) -> bool:
        return bool(self._gc_check or self._gc_owners)

    def run_gc(self, max_steps: int = 100000) -> int:
        """Run the garbage collector and the namespace/CRD cleanup until nothing is left to do."""
        steps = 0
        while (self._gc_check or self._gc_owners) and steps < max_steps:
            if self._gc_check:
                uid = self._gc_check.pop()
                steps += self._gc_dependent(uid)
                continue
            uid = self._gc_owners.pop()
            steps += self._gc_owner(uid)
        return steps

    def _gc_dependent(self, uid: str) -> int:
        found = self._by_uid(uid)
        if found is None:
            return 0
        rtype, obj = found
        refs = list(obj["metadata"].get("ownerReferences") or [])
        if not refs:
            return 0
        solid, dangling, waiting = [], [], []
        for ref in refs:
            state, owner = self._lookup_owner(obj, ref)
            if state == "unresolvable":
                solid.append(ref)
            elif state == "absent":
                dangling.append(ref)
            elif (
                owner is not None
                and owner["metadata"].get("deletionTimestamp")
                and FOREGROUND in (owner["metadata"].get("finalizers") or [])
            ):
                waiting.append(ref)
            else:
                solid.append(ref)
        if solid:
            if dangling or waiting:
                keep = [r for r in refs if r not in dangling and r not in waiting]
                self._set_meta(rtype, obj, ownerReferences=keep)
                return 1
            return 0
        if obj["metadata"].get("deletionTimestamp"):
            return 0
        foreground = any(r.get("blockOwnerDeletion") for r in waiting)
        ns = obj["metadata"].get("namespace", "")
        try:
            self.delete(
                rtype,
                ns,
                obj["metadata"]["name"],
                DeleteOptions(propagation="Foreground" if foreground else ""),
            )
        except ApiError:
            return 0
        self.stats.gc_deletions += 1
        for owner_uid in {r.get("uid", "") for r in waiting}:
            self._gc_owners.add(owner_uid)
        return 1

    def _gc_owner(self, uid: str) -> int:
        found = self._by_uid(uid)
        if found is None:
            return 0
        rtype, obj = found
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            return 0
        fins = meta.get("finalizers") or []
        steps = 0
        if ORPHAN in fins:
            for dep_uid in list(self.dependents.get(uid, ())):
                dep = self._by_uid(dep_uid)
                if dep is None:
                    continue
                drtype, dobj = dep
                keep = [r for r in dobj["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                self._set_meta(drtype, dobj, ownerReferences=keep or None)
                steps += 1
            self._remove_finalizer(rtype, obj, ORPHAN)
            return steps + 1
        if FOREGROUND in fins:
            blocking = 0
            for dep_uid in list(self.dependents.get(uid, ())):
                dep = self._by_uid(dep_uid)
                if dep is None:
                    continue
                _, dobj = dep
                refs: list[dict[str, Any]] = dobj["metadata"].get("ownerReferences") or []
                ref = next((r for r in refs if r.get("uid") == uid), {})
                if not dobj["metadata"].get("deletionTimestamp"):
                    self._gc_check.add(dep_uid)
                if ref.get("blockOwnerDeletion"):
                    blocking += 1
            if blocking == 0:
                self._remove_finalizer(rtype, obj, FOREGROUND)
                return 1
            return steps
        if rtype.key == NS_KEY:
            return self._finalize_namespace(obj)
        if rtype.key == CRD_KEY and CRD_CLEANUP in fins:
            spec = obj["spec"]
            crtype = self.registry.get(spec["group"], spec["names"]["plural"])
            left = list(self.select(crtype, "", (), ())) if crtype is not None else []
            for _, cr in left:
                if crtype is not None and not cr["metadata"].get("deletionTimestamp"):
                    self.delete(crtype, cr["metadata"].get("namespace", ""), cr["metadata"]["name"])
                    steps += 1
            if crtype is None or not any(True for _ in self.select(crtype, "", (), ())):
                self._remove_finalizer(rtype, obj, CRD_CLEANUP)
                return steps + 1
            return steps
        return 0

    def _namespaced_in(self, ns: str) -> Iterator[tuple[ResourceType, Ident, dict[str, Any]]]:
        for t in self.registry.all():
            if not t.namespaced or t.storage is not None or t.virtual:
                continue
            for ident, obj in list(self.objects.get(t.key, {}).items()):
                if ident[0] == ns:
                    yield t, ident, obj

    def _finalize_namespace(self, ns_obj: dict[str, Any]) -> int:
        """The namespace controller: delete all content, then drop the ``kubernetes`` finalizer."""
        ns = ns_obj["metadata"]["name"]
        steps = 0
        for t, ident, obj in list(self._namespaced_in(ns)):
            if not obj["metadata"].get("deletionTimestamp"):
                self.delete(t, ns, ident[1])
                steps += 1
        if any(True for _ in self._namespaced_in(ns)):
            return steps
        rtype = self.rtype("", "namespaces")
        new = copy.deepcopy(ns_obj)
        new["spec"] = {**(new.get("spec") or {}), "finalizers": []}
        ident = ("", ns)
        if new["metadata"].get("finalizers"):
            self._commit(rtype, ident, new, "MODIFIED")
        else:
            self._objs(rtype)[ident] = new
            self._commit(rtype, ident, None, "DELETED")
        return steps + 1


def _int(rv: str) -> int:
    try:
        return int(rv)
    except ValueError:
        raise bad_request(f"invalid resource version: {rv!r}") from None


def _spec_changed(old: Mapping[str, Any], new: Mapping[str, Any], has_status: bool) -> bool:
    skip = {"metadata", "status"} if has_status else {"metadata"}
    keys = (set(old) | set(new)) - skip
    return any(old.get(k) != new.get(k) for k in keys)


def _strip_meta(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in config.items() if k != "metadata"}


def _applied_record(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a field manager is remembered to have applied."""
    return {**_strip_meta(config), "metadata": _apply_meta(config.get("metadata") or {})}


def _apply_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of applied metadata a manager can own."""
    return {
        k: copy.deepcopy(v)
        for k, v in meta.items()
        if k in ("labels", "annotations", "finalizers", "ownerReferences")
    }
