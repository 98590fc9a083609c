"""The controller's half of a gateway's status, and the Events its changes deserve. Pure.

The controller owns ``conditions``, ``observedGeneration``, ``nodeName``, ``publicIP`` and ``ha``; the
status-agent owns ``tunnels`` / ``peers`` / ``agent``. Each writes only its own keys with a merge patch,
so neither clobbers the other (tests write both at once).

Conditions follow Kubernetes' conventions (type, status, reason, message, lastTransitionTime,
observedGeneration); ``lastTransitionTime`` changes only when the status does, so an unchanged world
computes an unchanged status and the controller writes nothing:

* ``ConfigRendered``: the CR (and its peers) validated and rendered to a plan; False names every field
  error (the last good plan keeps running).
* ``CloudReady``: the cloud backend has NIC2 (and, with OpenStack, the port, floating IP, attachment)
  for the gateway; the reason names the step that failed.
* ``PodReady``: the gateway pod runs on its pinned node and its agents are ready.
* ``Ready``: all of the above, but the advisory ones (``ADVISORY``).
* (with OpenStack) ``RoutingReady``, ``SecurityGroupScoped``: passed through from the cloud backend.
  ``SecurityGroupScoped`` False says the IKE/WireGuard port is open wider than the peers' addresses
  (a peer known by hostname); the gateway still serves, so it does not make ``Ready`` False.
* (with HA) ``StandbyReady``: a second pod stands by Ready on another node (``controller.ha``); advisory,
  as the gateway serves without one.
* ``OwnedObjects`` (only while False): an object of the gateway's name is not ours (``ObjectNameTaken``),
  or the API refused a write of one (``owned_condition``: the API's reason, ``Forbidden``, ``NotFound``,
  ``AlreadyExists``, ``Invalid``, and its message; never the object's content).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.names import GatewayKey

Obj = dict[str, Any]
MAX_MESSAGE = 32768
"""metav1.Condition's message limit."""


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str

    def to_api(self, generation: int, since: str) -> Obj:
        return {
            "type": self.type,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": self.message[:MAX_MESSAGE],
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }


@dataclass(frozen=True)
class StatusEvent:
    type: str
    """``Normal`` or ``Warning``."""
    reason: str
    message: str


OWNED_OBJECTS = "OwnedObjects"
OBJECT_NAME_TAKEN = "ObjectNameTaken"


@dataclass(frozen=True)
class WriteFailure:
    """A write of one of the gateway's objects that the API refused (``controller.execute`` collects
    them). Only what the API said: never the object's content (a plan, a Secret's name-value pairs)."""

    kind: str
    name: str
    """``namespace/name``."""
    verb: str
    """``create``, ``replace``, ``delete``, ``patch``."""
    code: int
    """The HTTP status (403, 404, 409, 422, ...)."""
    reason: str
    """The API's ``Status.reason``: ``Forbidden``, ``NotFound``, ``AlreadyExists``, ``Invalid``, ..."""
    message: str
    """The API's ``Status.message`` (it names the object and the rule)."""
    holder: str | None = None
    """``AlreadyExists``: whose the object of that name is (``whose``)."""

    def __str__(self) -> str:
        whose = f" (it is not this gateway's: {self.holder})" if self.holder else ""
        return f"{self.verb} {self.kind} {self.name}: {self.reason}: {self.message}{whose}"


MAX_HOLDER = 512


def whose(obj: Mapping[str, Any]) -> str:
    """Who an object seems to belong to, by its labels and ownerReferences only (never its content)."""
    md = obj.get("metadata") or {}
    labels = md.get("labels") or {}
    refs = [
        f"{r.get('kind')}/{r.get('name')}" for r in md.get("ownerReferences") or [] if isinstance(r, Mapping)
    ]
    parts = [
        "labels " + (", ".join(f"{k}={v}" for k, v in sorted(labels.items())) if labels else "none"),
        "ownerReferences " + (", ".join(refs) if refs else "none"),
    ]
    return "; ".join(parts)[:MAX_HOLDER]


def owned_condition(foreign: Sequence[str], failures: Sequence[WriteFailure]) -> Condition | None:
    """``OwnedObjects=False`` when an object of the gateway's name is someone else's (``foreign``:
    ``Kind/namespace/name``, seen in the caches) or the API refused a write (``failures``); None when all
    is well. The reason is the first failure's API reason (``ObjectNameTaken`` when only ``foreign``);
    the message names every object with its reason and the API's message."""
    if not foreign and not failures:
        return None
    said = [str(f) for f in failures]
    if foreign:
        said.append(f"{', '.join(foreign)} exist and do not belong to this gateway")
    reason = failures[0].reason if failures else OBJECT_NAME_TAKEN
    return Condition(OWNED_OBJECTS, False, reason or "Error", "; ".join(said))


ADVISORY = frozenset({"SecurityGroupScoped", "StandbyReady"})
"""Conditions that say something worth knowing but do not stop the gateway serving: not part of Ready."""


def conditions(
    parts: Sequence[Condition], previous: Sequence[Mapping[str, Any]], generation: int, now: str
) -> list[Obj]:
    """The conditions to store, with ``Ready`` first (``parts`` plus Ready computed from them, the
    ``ADVISORY`` ones aside), each keeping its previous ``lastTransitionTime`` while its status is
    unchanged."""
    failing = [c for c in parts if not c.status and c.type not in ADVISORY]
    ready = Condition(
        "Ready",
        not failing,
        "Ready" if not failing else failing[0].reason,
        "the gateway serves its plan"
        if not failing
        else "; ".join(f"{c.type}: {c.message}" for c in failing),
    )
    prev = {str(c.get("type")): c for c in previous}
    out = []
    for c in [ready, *parts]:
        old = prev.get(c.type)
        same = old is not None and old.get("status") == ("True" if c.status else "False")
        since = str(old.get("lastTransitionTime")) if same and old and old.get("lastTransitionTime") else now
        out.append(c.to_api(generation, since))
    return out


CONTROLLER_KEYS = ("conditions", "observedGeneration", "nodeName", "publicIP", "ha")
"""The status keys the controller owns (the status-agent owns the others)."""


def status_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> Obj | None:
    """A merge patch of the controller's status keys that turns ``current`` into ``wanted``; None when
    they already agree (a no-op reconcile writes nothing). A key we no longer want is patched to null; an
    object (``ha``) is patched key by key, its keys that go as null (RFC 7386 merges nested objects)."""
    patch: Obj = {}
    for key in CONTROLLER_KEYS:
        want = wanted.get(key)
        have = current.get(key)
        if have == want:
            continue
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            patch[key] = {k: want.get(k) for k in sorted({*have, *want}) if have.get(k) != want.get(k)}
        else:
            patch[key] = want
    return patch or None


QUIET_FIRST = frozenset({"NoPod", "NoNIC2", "StandbyPending"})
"""First reasons that are a gateway's normal way into being (no pod yet): not worth an Event."""


def events(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[StatusEvent]:
    """The Events a status change deserves (none when nothing changed):

    * a condition other than Ready: when its status or reason changes; when it first appears, only if it
      is False for a reason other than the ordinary first ones (``QUIET_FIRST``);
    * Ready: only when it flips (False -> True: Normal ``Ready``; True -> False: Warning), or first appears
      True; its cause has an Event of its own."""
    prev = {str(c.get("type")): c for c in before}
    out = []
    for c in after:
        old = prev.get(str(c["type"]))
        ok = c["status"] == "True"
        if c["type"] == "Ready":
            flipped = old.get("status") != c["status"] if old is not None else ok
            if not flipped:
                continue
        elif old is None:
            if ok or c["reason"] in QUIET_FIRST:
                continue
        elif old.get("status") == c["status"] and old.get("reason") == c["reason"]:
            continue
        out.append(
            StatusEvent("Normal" if ok else "Warning", str(c["reason"]), f"{c['type']}: {c['message']}")
        )
    return out


def event_object(
    key: GatewayKey, uid: str, event: StatusEvent, now: str, reporter: str, namespace: str | None = None
) -> Obj:
    digest = hashlib.sha256(f"{uid}|{event.reason}|{event.message}|{now}".encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{key.name}.{digest}", "namespace": namespace or key.namespace},
        "involvedObject": {
            "apiVersion": key.api_version,
            "kind": key.kind,
            "name": key.name,
            "namespace": key.namespace,
            "uid": uid,
        },
        "reason": event.reason,
        "message": event.message[:1024],
        "type": event.type,
        "source": {"component": "vpngw-controller"},
        "reportingComponent": "vpngw-controller",
        "reportingInstance": reporter,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
