"""The one executor: performs a reconcile's decision against the API. Thin I/O, no decisions.

Every write carries the controller's field manager (``vpngw-controller``). Updates are PUTs with the
resourceVersion the decision was made on, so a write based on a stale cache fails with 409 instead of
overwriting someone's newer change; the reconcile is then requeued and decides again on fresh data. The
finalizer is added and removed with JSON patches that test the resourceVersion for the same reason.
The status is a merge patch of the controller's own keys only (the agent's keys are not touched), on the
resourceVersion the decision saw: a status decided from a stale cache (the controller's own last write
not seen yet, say) is a 409 and a requeue, never a rewrite of a newer status nor a second Event.

A write the API refuses (403, 404, 409 AlreadyExists, 422, ...) does not stop the others: every action
is tried, the refusals are collected (``status.WriteFailure``), and the status written at the end says
them (``reconcile.outcome``: ``OwnedObjects=False``); the caller then retries with backoff (``Failed``).
A 409 Conflict (a stale resourceVersion, a uid precondition, an AlreadyExists for an object that is ours
but not in the cache yet) is ``Requeue``: decide again, nothing to report.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller import diff
from controller.names import FINALIZER, LABEL_OWNER_UID, GatewayKey
from controller.reconcile import Decision, outcome
from controller.status import CONTROLLER_KEYS, StatusEvent, WriteFailure, event_object, whose
from gwkit.kube import ApiError, Conflict, KubeClient, NotFound, Obj, Resource
from gwkit.kube.client import BY_KIND, EVENTS, PODS, VPNPEERS

log = logging.getLogger(__name__)


class Requeue(Exception):
    """The decision was made on data that is no longer current (409): decide again."""


class Failed(ApiError):
    """Writes the API refused (the status says which and why): retry with backoff. The first failure's
    code and reason, every failure in the message (kind, name, the API's reason and message only)."""

    def __init__(self, failures: list[WriteFailure]) -> None:
        first = failures[0]
        super().__init__(first.code, first.reason, "; ".join(str(f) for f in failures))
        self.failures = failures


class Taken(Exception):
    """A create refused as AlreadyExists: the object of that name is someone else's (``holder``)."""

    def __init__(self, error: ApiError, holder: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.holder = holder


@dataclass
class Counts:
    writes: int = 0
    creates: int = 0
    replaces: int = 0
    failures: list[WriteFailure] = field(default_factory=list)
    """The writes the API refused (already said in the status)."""


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
    counts: Counts | None = None,
) -> Counts:
    """Every action, then the status and the Events; the writes the API accepted are in ``counts`` (the
    caller's, when given: they hold what was written also when a later write raises, e.g. a status 409)."""
    counts = Counts() if counts is None else counts
    md = gateway["metadata"]
    version = str(md.get("resourceVersion") or "")
    for action in decision.actions:
        try:
            await _perform(kube, action, counts)
        except Taken as exc:
            kind, name, verb = _what(action)
            counts.failures.append(_failure(kind, name, verb, exc.error, exc.holder))
        except ApiError as exc:
            kind, name, verb = _what(action)
            counts.failures.append(_failure(kind, name, verb, exc))
    status, events = decision.status, list(decision.events)
    if counts.failures and decision.report is not None:
        status, events = outcome(decision.report, counts.failures)
    # Events of what was just written (Repinned) go now: a status decided on a stale read is decided
    # again, and that decision no longer sees the move. Those of the status go once it is written.
    done = [e for e in events if decision.report is not None and e in decision.report.also]
    await _send(kube, key, md, [e for e in events if e in done], now, reporter, counts)
    if status is not None:
        await _write_status(kube, key, gateway, version, status)
        counts.writes += 1
    await _send(kube, key, md, [e for e in events if e not in done], now, reporter, counts)
    for f in counts.failures:
        log.warning("object.refused gateway=%s %s", key, f)
    return counts


async def _send(
    kube: KubeClient,
    key: GatewayKey,
    md: Mapping[str, Any],
    events: list[StatusEvent],
    now: str,
    reporter: str,
    counts: Counts,
) -> None:
    for ev in events:
        try:
            await kube.create(EVENTS, event_object(key, str(md["uid"]), ev, now, reporter), key.namespace)
            counts.writes += 1
        except Exception as exc:  # an Event is a courtesy: never fail a reconcile for one
            log.warning("event.failed gateway=%s reason=%s error=%r", key, ev.reason, str(exc))


async def _write_status(
    kube: KubeClient, key: GatewayKey, seen: Mapping[str, Any], version: str, status: Mapping[str, Any]
) -> None:
    """The status patch on the version the decision saw. A 409 says the gateway moved on since: when
    its generation and the controller's keys are still what the decision saw (the status-agent wrote its
    own keys meanwhile), the patch goes without the precondition (no one else writes the controller's
    keys, and one key is never reconciled twice at once); otherwise the status was decided on a stale
    read (the controller's own last write not in the cache yet, or a new spec): ``Requeue``, nothing
    written, no Event sent."""
    res = gateway_resource(key)
    body: dict[str, Any] = {"status": dict(status)}
    try:
        if version:
            at = {**body, "metadata": {"resourceVersion": version}}
            await kube.patch(res, key.name, at, key.namespace, subresource="status")
            return
    except NotFound:
        raise Requeue(f"{key} is gone") from None
    except Conflict as exc:
        now = await _read(kube, res, key.name, key.namespace)
        if now is None:
            raise Requeue(f"{key} is gone") from None
        if not same_decision_basis(seen, now):
            raise Requeue(f"status of {key} decided on a stale read: {exc}") from None
    try:
        await kube.patch(res, key.name, body, key.namespace, subresource="status")
    except NotFound:
        raise Requeue(f"{key} is gone") from None


async def write_peer_statuses(
    kube: KubeClient, namespace: str, patches: Mapping[str, Mapping[str, Any]]
) -> int:
    """The controller's part of its gateway's VPNPeers' statuses (``controller.peerstatus``); a courtesy,
    as an Event is: a refused or failed write is logged and tried again at the next reconcile (the patch
    is decided again from the stored status). Returns how many were written."""
    written = 0
    for name, patch in patches.items():
        try:
            await kube.patch(VPNPEERS, name, {"status": dict(patch)}, namespace, subresource="status")
            written += 1
        except NotFound:
            pass  # deleted meanwhile
        except Exception as exc:
            log.warning("peer_status.failed peer=%s/%s error=%r", namespace, name, str(exc))
    return written


def same_decision_basis(seen: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether ``now`` (the gateway as the API holds it) has the generation and the controller's status
    keys of ``seen`` (the gateway the decision was made on)."""

    def basis(gw: Mapping[str, Any]) -> tuple[Any, ...]:
        st = gw.get("status") or {}
        return ((gw.get("metadata") or {}).get("generation"), *(st.get(k) for k in CONTROLLER_KEYS))

    return basis(seen) == basis(now)


def _what(action: diff.Action) -> tuple[str, str, str]:
    """(kind, namespace/name, verb) of ``action``."""
    if isinstance(action, diff.Delete):
        return action.kind, f"{action.namespace}/{action.name}", "delete"
    md = action.obj["metadata"]
    verb = "create" if isinstance(action, diff.Create) else "replace"
    return str(action.obj["kind"]), f"{md.get('namespace')}/{md['name']}", verb


def _failure(kind: str, name: str, verb: str, exc: ApiError, holder: str | None = None) -> WriteFailure:
    reason, message = exc.reason, exc.message.strip()
    if exc.code == 404 and reason == "Error":
        # No Status at all: the API server does not serve the kind (its CRD is not installed; the real
        # server's notfoundhandler answers a bare "404 page not found").
        reason = "NotFound"
        message = (
            f"the API server does not serve {kind} (its CustomResourceDefinition is not installed): {message}"
        )
    return WriteFailure(kind, name, verb, exc.code, reason, message, holder)


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
    """One action; ``Requeue`` when the decision was made on stale data, ``ApiError`` when the API refuses
    it for a reason deciding again does not change."""
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
            holder = await _holder(kube, res, obj) if exc.already_exists else None
            if holder is not None:  # someone else's object of our name: reported, never touched
                raise Taken(exc, holder) from None
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


async def _holder(kube: KubeClient, res: Resource, obj: Mapping[str, Any]) -> str | None:
    """Whose the object of ``obj``'s name is that the API already holds (``status.whose``); None when it
    is this gateway's (made by an earlier reconcile whose write the cache has not seen yet: decide again)
    or gone again meanwhile."""
    md = obj["metadata"]
    uid = (md.get("labels") or {}).get(LABEL_OWNER_UID) or next(
        (r.get("uid") for r in md.get("ownerReferences") or []), None
    )
    try:
        have = await _read(kube, res, md["name"], md.get("namespace"))
    except ApiError as exc:
        return f"it cannot be read: {exc.reason}"
    if have is None or (uid is not None and diff.owned_by(have, str(uid))):
        return None
    return whose(have)


async def _read(kube: KubeClient, res: Resource, name: str, namespace: str | None) -> Obj | None:
    """The object of ``name``, None when there is none: a list of the one name, as the controller may
    list and watch what it reads and writes (``controller.rbac``), not get it."""
    found, _ = await kube.list(res, namespace, field_selector=f"metadata.name={name}")
    return found[0] if found else None


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
