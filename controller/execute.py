"""The one executor: performs a reconcile's decision against the API. Thin I/O, no decisions.

Every write carries the controller's field manager (``vpngw-controller``). Updates are PUTs with the
resourceVersion the decision was made on, so a write based on a stale cache fails with 409 instead of
overwriting someone's newer change; the reconcile is then requeued and decides again on fresh data. The
finalizer is added and removed with JSON patches that test the resourceVersion for the same reason.
The status is a merge patch of the controller's own keys only (the agent's keys are not touched).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller import diff
from controller.names import FINALIZER, GatewayKey
from controller.reconcile import Decision
from controller.status import StatusEvent, event_object
from gwkit.kube import Conflict, KubeClient, NotFound, Obj, Resource
from gwkit.kube.client import BY_KIND, EVENTS, PODS

log = logging.getLogger(__name__)


class Requeue(Exception):
    """The decision was made on data that is no longer current (409): decide again."""


@dataclass
class Counts:
    writes: int = 0
    creates: int = 0
    replaces: int = 0


def gateway_resource(key: GatewayKey) -> Resource:
    return BY_KIND[key.kind]


async def apply(
    kube: KubeClient,
    key: GatewayKey,
    gateway: Mapping[str, Any],
    decision: Decision,
    *,
    now: str,
    reporter: str,
) -> Counts:
    counts = Counts()
    md = gateway["metadata"]
    res = gateway_resource(key)
    if decision.add_finalizer:
        finalizers = [*(md.get("finalizers") or []), FINALIZER]
        await _guarded(kube.patch(res, key.name, _finalizers_at(md, finalizers), key.namespace))
        counts.writes += 1
    for action in decision.actions:
        await _perform(kube, action, counts)
    if decision.status is not None:
        try:
            await kube.patch(res, key.name, {"status": decision.status}, key.namespace, subresource="status")
        except NotFound:
            raise Requeue(f"{key} is gone") from None
        counts.writes += 1
    for ev in decision.events:
        try:
            await kube.create(EVENTS, event_object(key, str(md["uid"]), ev, now, reporter), key.namespace)
            counts.writes += 1
        except Exception as exc:  # an Event is a courtesy: never fail a reconcile for one
            log.warning("event.failed gateway=%s reason=%s error=%r", key, ev.reason, str(exc))
    return counts


def _finalizers_at(md: Mapping[str, Any], finalizers: list[str]) -> dict[str, Any]:
    """A merge patch of the finalizers (the whole list) on the version we read: a stale read is 409
    Conflict. Not a JSON patch with a ``test``: the real server's 422 for a failed test says only "the
    server rejected our request due to an error in our request", indistinguishable from any other
    (found against kube-apiserver v1.35)."""
    return {"metadata": {"resourceVersion": md["resourceVersion"], "finalizers": finalizers}}


async def _guarded(call: Any) -> Any:
    try:
        return await call
    except Conflict as exc:  # the object moved on since we read it
        raise Requeue(str(exc)) from None


async def _perform(kube: KubeClient, action: diff.Action, counts: Counts) -> None:
    if isinstance(action, diff.Delete):
        res = BY_KIND[action.kind]
        try:
            await kube.delete(res, action.name, action.namespace, uid=action.uid, propagation="Background")
        except NotFound:
            return  # gone already
        except Conflict as exc:  # the uid precondition failed: a new object of that name, not ours to delete
            raise Requeue(f"delete {res}/{action.name}: {exc}") from None
        log.info(
            "object.deleted kind=%s name=%s/%s why=%r", action.kind, action.namespace, action.name, action.why
        )
        counts.writes += 1
        return
    if isinstance(action, diff.Create):
        obj = action.obj
        res = BY_KIND[str(obj["kind"])]
        try:
            await kube.create(res, obj, obj["metadata"]["namespace"])
        except Conflict as exc:
            raise Requeue(f"create {res}/{obj['metadata']['name']}: {exc}") from None
        counts.creates += 1
        log.info(
            "object.created kind=%s name=%s/%s",
            obj["kind"],
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
        )
    else:
        obj = action.obj
        res = BY_KIND[str(obj["kind"])]
        try:
            await kube.replace(res, obj, obj["metadata"]["namespace"])
        except (Conflict, NotFound) as exc:
            raise Requeue(f"replace {res}/{obj['metadata']['name']}: {exc}") from None
        counts.replaces += 1
        log.info(
            "object.%s kind=%s name=%s/%s",
            action.why,
            obj["kind"],
            obj["metadata"]["namespace"],
            obj["metadata"]["name"],
        )
    counts.writes += 1


async def delete_all(kube: KubeClient, deletions: list[diff.Delete]) -> int:
    """Perform ``deletions`` (the finalizer's cleanup); the number of deletes sent."""
    counts = Counts()
    for d in deletions:
        await _perform(kube, d, counts)
    return counts.writes


async def add_finalizer(kube: KubeClient, key: GatewayKey, gateway: Mapping[str, Any]) -> Obj:
    """Put the finalizer on the gateway (on the version read: 409 requeues); the object as the API now
    holds it."""
    md = gateway["metadata"]
    finalizers = [*(md.get("finalizers") or []), FINALIZER]
    try:
        obj: Obj = await _guarded(
            kube.patch(gateway_resource(key), key.name, _finalizers_at(md, finalizers), key.namespace)
        )
    except NotFound:
        raise Requeue(f"{key} is gone") from None
    log.info("gateway.finalizer_added gateway=%s", key)
    return obj


async def remove_finalizer(kube: KubeClient, key: GatewayKey, gateway: Mapping[str, Any]) -> None:
    md = gateway["metadata"]
    rest = [f for f in md.get("finalizers") or [] if f != FINALIZER]
    try:
        await _guarded(kube.patch(gateway_resource(key), key.name, _finalizers_at(md, rest), key.namespace))
    except NotFound:
        return


async def force_delete(
    kube: KubeClient,
    key: GatewayKey,
    gateway: Mapping[str, Any],
    pod: Mapping[str, Any],
    why: str,
    *,
    now: str,
    reporter: str,
) -> bool:
    """Delete ``pod`` with grace 0 (the API forgets it at once, no kubelet asked) and say so in an Event
    on the gateway; False when it was gone already (or replaced: the uid precondition)."""
    md = pod["metadata"]
    try:
        await kube.delete(PODS, md["name"], md["namespace"], uid=md.get("uid"), grace_seconds=0)
    except (NotFound, Conflict):
        return False
    log.warning("pod.force_deleted gateway=%s pod=%s/%s why=%r", key, md["namespace"], md["name"], why)
    ev = StatusEvent("Warning", "PodForceDeleted", f"pod {md['name']}: {why}")
    try:
        await kube.create(
            EVENTS, event_object(key, str(gateway["metadata"]["uid"]), ev, now, reporter), key.namespace
        )
    except Exception as exc:  # an Event is a courtesy
        log.warning("event.failed gateway=%s reason=%s error=%r", key, ev.reason, str(exc))
    return True
