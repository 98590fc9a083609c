"""What to write to make the API hold what a gateway should have. Pure.

An object is in order when it carries our desired-hash annotation (``names.ANNOTATION_HASH``) with the
current hash AND every field we set has our value (``covers``: fields others add, such as the API
server's defaults, are left alone). A different hash means our wish changed: the object is replaced
(PUT with its resourceVersion), which also drops fields we no longer set. A field someone edited is
restored the same way. Some fields are ours whole (``WHOLE``): a ConfigMap's ``data`` and ``binaryData``
hold the plan and nothing else, so a key someone added (a second plan in ``binaryData``, say) makes the
object out of order and goes at the replace. Every gateway has every owned slot (some held back until
they can be decided); what is deleted is said by the reconcile (``Delete``: the gateway's objects when
it goes, what an earlier release left in the tenant's namespace). Nothing is written for an object in
order: a no-op reconcile makes no write at all. Some kinds are created and never written again
(``CREATE_ONLY``): an HA gateway's Lease, whose holder and renewals are its agents'.

An object is ours when its ownerReference or, in the gateway namespace where none can point across
namespaces, its ``names.LABEL_OWNER_UID`` label names the gateway's uid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.names import ANNOTATION_HASH, LABEL_OWNER_UID

Obj = dict[str, Any]


@dataclass(frozen=True)
class Create:
    obj: Obj


@dataclass(frozen=True)
class Replace:
    obj: Obj
    """The whole new object, with the current ``metadata.resourceVersion`` (a precondition)."""
    why: str


@dataclass(frozen=True)
class Delete:
    kind: str
    namespace: str
    name: str
    uid: str
    """The object's own uid: a precondition, so a newer object of the same name is never deleted."""
    why: str


@dataclass(frozen=True)
class Foreign:
    """An object of our name that this gateway does not own: never touched, reported."""

    kind: str
    name: str


Action = Create | Replace | Delete

CREATE_ONLY = frozenset({"Lease"})
"""Kinds the controller creates and then leaves alone, whatever they hold: an HA gateway's Lease is its
agents' to write (holder, renewTime, its duration), and a "repaired" Lease would hand it to nobody, or
back to a pod that lost it (docs/ha.md). Deleted like any other (``deletions``, ``surplus``)."""

WHOLE: Mapping[str, tuple[str, ...]] = {"ConfigMap": ("data", "binaryData")}
"""Top-level fields that are ours whole, per kind: nothing of anyone else's is kept in them (an absent
map and an empty one are the same: the API server drops empty ones)."""


_POD = ("spec", "template", "spec")
SHARED_LISTS: Mapping[str, frozenset[tuple[str, ...]]] = {
    "Deployment": frozenset({(*_POD, "tolerations"), (*_POD, "imagePullSecrets")})
}
"""Lists, per kind, into which mutating admission may add items of its own (a policy engine's
toleration, a registry's pull secret): ours must be there, others may be too (``covers``). Elsewhere a
list is ours exactly. Not the containers, volumes or env: the gateway pod holds NET_ADMIN, NIC2, the
tunnels' keys and its tenant's Secrets, so a sidecar, a volume or an env var someone added goes at the
next reconcile (a webhook that injects them into Deployments must leave the gateway namespace out)."""


def covers(
    actual: Any, want: Any, shared: frozenset[tuple[str, ...]] = frozenset(), at: tuple[str, ...] = ()
) -> bool:
    """Every field of ``want`` is in ``actual`` with the same value. Lists: same length, item by item;
    at a path in ``shared`` (``*`` matches an item), every item of ours covered by one of theirs (named
    items by their name) and others allowed."""
    if isinstance(want, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and covers(actual[k], v, shared, (*at, str(k))) for k, v in want.items()
        )
    if isinstance(want, list):
        if not isinstance(actual, list):
            return False
        item = (*at, "*")
        if at in shared:
            return all(_covered_by_one(actual, w, shared, item) for w in want)
        return len(actual) == len(want) and all(
            covers(a, w, shared, item) for a, w in zip(actual, want, strict=True)
        )
    if isinstance(want, bool) or isinstance(actual, bool):
        return actual is want
    return bool(actual == want)


def _covered_by_one(
    actual: list[Any], want: Any, shared: frozenset[tuple[str, ...]], at: tuple[str, ...]
) -> bool:
    if isinstance(want, Mapping) and "name" in want:
        return any(
            isinstance(a, Mapping) and a.get("name") == want["name"] and covers(a, want, shared, at)
            for a in actual
        )
    return any(covers(a, want, shared, at) for a in actual)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    md = obj.get("metadata") or {}
    if (md.get("labels") or {}).get(LABEL_OWNER_UID) == uid:
        return True
    return any(r.get("uid") == uid for r in md.get("ownerReferences") or [])


def _whole_differs(actual: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return any((actual.get(f) or {}) != (want.get(f) or {}) for f in WHOLE.get(str(want.get("kind")), ()))


def replacement(actual: Mapping[str, Any], want: Mapping[str, Any]) -> Obj:
    """``want`` over ``actual``: our top-level fields replace theirs, other top-level fields (and the
    metadata others keep: their labels, annotations, finalizers) stay; the resourceVersion is the
    precondition."""
    md = dict(actual.get("metadata") or {})
    wmd = want.get("metadata") or {}
    md["labels"] = {**(md.get("labels") or {}), **(wmd.get("labels") or {})}
    md["annotations"] = {**(md.get("annotations") or {}), **(wmd.get("annotations") or {})}
    if wmd.get("ownerReferences"):
        md["ownerReferences"] = list(wmd["ownerReferences"])
    else:
        md.pop("ownerReferences", None)
    md.pop("managedFields", None)
    whole = WHOLE.get(str(want.get("kind")), ())
    out: Obj = {k: v for k, v in actual.items() if k not in ("metadata", "status", *whole)}
    out.update({k: v for k, v in want.items() if k != "metadata"})
    out["metadata"] = md
    return out


def plan_actions(
    desired: Sequence[tuple[str, Mapping[str, Any]]],
    actual: Mapping[str, Mapping[str, Any]],
    uid: str,
) -> tuple[list[Action], list[Foreign]]:
    """``desired``: (slot, object); ``actual``: slot -> the object of our name in that slot (if any)."""
    actions: list[Action] = []
    foreign: list[Foreign] = []
    for slot, want in desired:
        kind = str(want["kind"])
        have = actual.get(slot)
        if have is None:
            actions.append(Create(dict(want)))
            continue
        if not owned_by(have, uid):
            md = have["metadata"]
            foreign.append(Foreign(kind, f"{md.get('namespace')}/{md['name']}"))
            continue
        if (have.get("metadata") or {}).get("deletionTimestamp"):
            continue  # being deleted: created again once it is gone
        if kind in CREATE_ONLY:
            continue
        want_hash = (want.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_HASH)
        have_hash = ((have.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
        if want_hash != have_hash:
            actions.append(Replace(replacement(have, want), "changed"))
        elif _whole_differs(have, want) or not covers(
            have,
            {k: v for k, v in want.items() if k not in ("apiVersion", "kind")},
            SHARED_LISTS.get(kind, frozenset()),
        ):
            actions.append(Replace(replacement(have, want), "restored"))
    return actions, foreign


def deletions(objects: Sequence[Mapping[str, Any]], uid: str, why: str) -> list[Delete]:
    """A ``Delete`` for each of ``objects`` that is ours and not already going."""
    out = []
    for obj in objects:
        md = obj.get("metadata") or {}
        if owned_by(obj, uid) and not md.get("deletionTimestamp"):
            out.append(
                Delete(str(obj["kind"]), str(md.get("namespace")), str(md["name"]), str(md["uid"]), why)
            )
    return out


def surplus(
    desired: Sequence[tuple[str, Mapping[str, Any]]],
    held: Iterable[str],
    actual: Mapping[str, Mapping[str, Any]],
    uid: str,
    slots: Iterable[str],
    why: str,
) -> list[Delete]:
    """A ``Delete`` for the object in each of ``slots`` (in their order) that is ours while the gateway
    neither wants it now nor holds the slot back: an HA gateway's slot b and Lease once HA is off."""
    wanted = {slot for slot, _ in desired} | set(held)
    return deletions([actual[s] for s in slots if s not in wanted and s in actual], uid, why)
