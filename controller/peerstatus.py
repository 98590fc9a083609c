"""The controller's part of a VPNPeer's status (pure): ``Admitted`` False for a peer left out of the plan,
and ``observedGeneration`` of every peer.

The gateway's status-agent writes the rest for the peers in its plan (``agent/peerstatus.py``: state,
counters, ``Admitted`` True and ``Ready``). A peer left out of the plan has no agent to speak for it, and
only the controller knows why: it writes ``state: NotAdmitted``, the reason, and the conditions
``Admitted`` False and ``Ready`` False. Both writers merge-patch the whole ``conditions`` list, each only
for the peers on its side of the plan. ``observedGeneration`` (the generation the controller last
rendered) is written for every peer, alone, so it never touches what the agent wrote.

Each patch is returned only when the peer's stored status differs from it, so a resync writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.api.validate import Problem

NOT_ADMITTED = "NotAdmitted"
_COMPARED = ("type", "status", "reason", "message")


MESSAGE_MAX, SUMMARY_MAX = 1024, 256
"""Bounds on what a left-out peer's status carries (found by review: with the gateway's whole problem
list in three places, a tenant's thousands of peers cost etcd and the controller's cache a GB). The
whole list is on the gateway's ConfigRendered condition and in ``diagnose``."""
READY_MESSAGE = "left out of its gateway's plan: the Admitted condition says why"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _why(name: str, problems: Sequence[Problem], rendered: bool) -> tuple[str, list[str]]:
    """(reason, messages) of a peer left out: its own problems, else the gateway's."""
    mine = [p for p in problems if p.item.kind == "peer" and p.item.name == name]
    if mine:
        return mine[0].reason or "Invalid", [str(p) for p in mine]
    if not rendered:
        gw = [str(p) for p in problems if p.item.kind == "gateway"]
        return "GatewayNotRendered", gw or ["its gateway renders no plan"]
    return "NotInPlan", ["the controller left this peer out of its gateway's plan"]


def _message(messages: Sequence[str]) -> str:
    more = (
        f" (and {len(messages) - 1} more: the gateway's ConfigRendered condition)"
        if len(messages) > 1
        else ""
    )
    return _clip(messages[0], MESSAGE_MAX - len(more)) + more


def _same_conditions(stored: Any, want: Sequence[Mapping[str, Any]]) -> bool:
    if not isinstance(stored, list):
        return False
    have = [{k: c.get(k) for k in _COMPARED} for c in stored if isinstance(c, Mapping)]
    return have == [{k: c.get(k) for k in _COMPARED} for c in want]


def _since(stored: Mapping[str, Any], want: Mapping[str, Any], now: str) -> str:
    """The stored lastTransitionTime while the condition's status holds, else ``now``."""
    for c in stored.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == want["type"] and c.get("status") == want["status"]:
            return str(c.get("lastTransitionTime") or now)
    return now


def peer_patches(
    peers: Sequence[Mapping[str, Any]],
    planned: set[str],
    problems: Sequence[Problem],
    *,
    rendered: bool,
    now: str,
) -> dict[str, dict[str, Any]]:
    """Peer name -> its status merge patch, for the peers (VPNPeer documents of one gateway) whose stored
    status needs one. ``planned``: the peers of the plan in force (``gwplan.peer_names``); ``rendered``:
    whether a plan was rendered now (else the gateway's own problems are why a peer is out)."""
    out: dict[str, dict[str, Any]] = {}
    for doc in peers:
        md = doc.get("metadata") or {}
        name, generation = str(md.get("name")), md.get("generation")
        stored = doc.get("status") or {}
        patch: dict[str, Any] = {}
        if isinstance(generation, int) and stored.get("observedGeneration") != generation:
            patch["observedGeneration"] = generation
        if name not in planned:
            reason, messages = _why(name, problems, rendered)
            summary = _clip(messages[0], SUMMARY_MAX)
            conditions = [
                {"type": "Admitted", "status": "False", "reason": reason, "message": _message(messages)},
                {"type": "Ready", "status": "False", "reason": NOT_ADMITTED, "message": READY_MESSAGE},
            ]
            if (
                stored.get("state") != NOT_ADMITTED
                or stored.get("reason") != summary
                or not _same_conditions(stored.get("conditions"), conditions)
            ):
                patch.update(
                    state=NOT_ADMITTED,
                    reason=summary,
                    # Out of the plan, nothing flows: the agent's last counters and times are gone.
                    establishedAt=None,
                    latestHandshake=None,
                    bytesIn=None,
                    bytesOut=None,
                    conditions=[{**c, "lastTransitionTime": _since(stored, c, now)} for c in conditions],
                )
        if patch:
            out[name] = patch
    return out
