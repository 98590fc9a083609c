"""What to write to make the API hold what a gateway should have. Pure.

An object is in order when it carries our desired-hash annotation (``names.ANNOTATION_HASH``) with the
current hash AND every field we set has our value (``covers``: fields others add, such as the API
server's defaults, are left alone). A different hash means our wish changed: the object is replaced
(PUT with its resourceVersion), which also drops fields we no longer set. A field someone edited is
restored the same way. Every gateway has every owned kind (some held back until they can be decided),
so nothing is ever deleted here: the API server's garbage collector removes them with their gateway.
Nothing is written for an object in order: a no-op reconcile makes no write at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.names import ANNOTATION_HASH

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
class Foreign:
    """An object of our name that this gateway does not own: never touched, reported."""

    kind: str
    name: str


Action = Create | Replace


def covers(actual: Any, want: Any) -> bool:
    """Every field of ``want`` is in ``actual`` with the same value (lists: same length, item by item)."""
    if isinstance(want, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and covers(actual[k], v) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(want)
            and all(covers(a, w) for a, w in zip(actual, want, strict=True))
        )
    if isinstance(want, bool) or isinstance(actual, bool):
        return actual is want
    return bool(actual == want)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def replacement(actual: Mapping[str, Any], want: Mapping[str, Any]) -> Obj:
    """``want`` over ``actual``: our top-level fields replace theirs, other top-level fields (and the
    metadata others keep: their labels, annotations, finalizers) stay; the resourceVersion is the
    precondition."""
    md = dict(actual.get("metadata") or {})
    wmd = want.get("metadata") or {}
    md["labels"] = {**(md.get("labels") or {}), **(wmd.get("labels") or {})}
    md["annotations"] = {**(md.get("annotations") or {}), **(wmd.get("annotations") or {})}
    md["ownerReferences"] = list(wmd.get("ownerReferences") or [])
    md.pop("managedFields", None)
    out: Obj = {k: v for k, v in actual.items() if k not in ("metadata", "status")}
    out.update({k: v for k, v in want.items() if k != "metadata"})
    out["metadata"] = md
    return out


def plan_actions(
    desired: Sequence[Mapping[str, Any]],
    actual: Mapping[str, Mapping[str, Any]],
    uid: str,
) -> tuple[list[Action], list[Foreign]]:
    """``actual``: kind -> the object of our name of that kind (if any)."""
    actions: list[Action] = []
    foreign: list[Foreign] = []
    for want in desired:
        kind = str(want["kind"])
        have = actual.get(kind)
        if have is None:
            actions.append(Create(dict(want)))
            continue
        if not _owned_by(have, uid):
            foreign.append(Foreign(kind, str(have["metadata"]["name"])))
            continue
        if (have.get("metadata") or {}).get("deletionTimestamp"):
            continue  # being deleted: created again once it is gone
        want_hash = (want.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_HASH)
        have_hash = ((have.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
        if want_hash != have_hash:
            actions.append(Replace(replacement(have, want), "changed"))
        elif not covers(have, {k: v for k, v in want.items() if k not in ("apiVersion", "kind")}):
            actions.append(Replace(replacement(have, want), "restored"))
    return actions, foreign
