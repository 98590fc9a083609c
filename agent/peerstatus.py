"""A VPNPeer's own status, derived from the gateway status the agent publishes (pure: data and clock in).

The agent already computes each planned peer's state for its VPNGateway (``status.tunnels`` from charon's
SAs, ``status.peers`` from the WireGuard device); a VPNPeer's status is that same entry, said in the
peer's words, so the two can never disagree::

    {state: Established | Connecting | Down | AuthFailed, reason, establishedAt (IPsec), latestHandshake
     (WireGuard), bytesIn, bytesOut, conditions: [Admitted True, Ready]}

``NotAdmitted`` is never written here: a peer the controller left out of the plan is not in the gateway's
status, and the controller (which knows why) says so. Being in the plan is being admitted, so the agent
writes ``Admitted`` True. Both writers merge-patch the whole ``conditions`` list (a merge patch replaces a
list), each only for the peers on its side of the plan, so neither overwrites the other's.

The mapping:

* IPsec: Established, Connecting and Down as they are; Failed is AuthFailed when charon's reason is an
  AUTHENTICATION_FAILED, else Down with the reason (no common proposal, the peer not responding...).
* WireGuard: Connected is Established; Stale (no handshake for 180 s: the session is dead) and
  NeverConnected are Down; Failed (the agent left the peer off the device, e.g. its preshared key Secret
  is missing) is Down with that reason. WireGuard cannot tell a wrong key from silence (a handshake that
  does not authenticate is dropped without a reply), so it never says AuthFailed.

``observedGeneration`` is not the agent's to say: the plan does not carry the peers' generations (the
controller knows which generation it rendered).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ESTABLISHED, CONNECTING, DOWN, AUTH_FAILED, NOT_ADMITTED = (
    "Established",
    "Connecting",
    "Down",
    "AuthFailed",
    "NotAdmitted",
)
_WG_STATE = {"Connected": ESTABLISHED, "Stale": DOWN, "NeverConnected": DOWN, "Failed": DOWN}
_WG_REASON = {
    "Stale": "no handshake for 180 s (the session has expired)",
    "NeverConnected": "no handshake yet",
}


def _ipsec(entry: Mapping[str, Any]) -> dict[str, Any]:
    state = str(entry.get("state") or DOWN)
    reason = entry.get("lastError")
    if state == "Failed":
        state = AUTH_FAILED if str(reason or "").startswith("AUTHENTICATION_FAILED") else DOWN
    out: dict[str, Any] = {
        "state": state if state in (ESTABLISHED, CONNECTING, DOWN, AUTH_FAILED) else DOWN,
        "reason": None if state == ESTABLISHED else (str(reason) if reason else None),
        "establishedAt": entry.get("establishedAt"),
        "bytesIn": int(entry.get("bytesIn") or 0),
        "bytesOut": int(entry.get("bytesOut") or 0),
    }
    return out


def _wireguard(entry: Mapping[str, Any]) -> dict[str, Any]:
    wg_state = str(entry.get("state") or "NeverConnected")
    reason = entry.get("lastError") or _WG_REASON.get(wg_state)
    return {
        "state": _WG_STATE.get(wg_state, DOWN),
        "reason": str(reason) if reason else None,
        "latestHandshake": entry.get("latestHandshake"),
        "bytesIn": int(entry.get("bytesIn") or 0),
        "bytesOut": int(entry.get("bytesOut") or 0),
    }


def _condition(
    type_: str, status: bool, reason: str, message: str, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """A condition whose lastTransitionTime stays as it was while its status does not change."""
    value = "True" if status else "False"
    old = [
        c
        for c in (previous or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") == type_
    ]
    since = old[0].get("lastTransitionTime") if old and old[0].get("status") == value else None
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }


def peer_status(entry: Mapping[str, Any], *, previous: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """The VPNPeer status of one ``status.tunnels[]`` (IPsec) or ``status.peers[]`` (WireGuard) entry.

    ``previous``: the status last written for this peer (keeps the conditions' lastTransitionTime), None
    at first; ``now``: RFC 3339 UTC. Keys whose value is None delete the field (a merge patch)."""
    out = _wireguard(entry) if "publicKey" in entry else _ipsec(entry)
    up = out["state"] == ESTABLISHED
    out["conditions"] = [
        _condition(
            "Admitted", True, "InPlan", "the controller put this peer in its gateway's plan", previous, now
        ),
        _condition(
            "Ready",
            up,
            ESTABLISHED if up else out["state"],
            "the tunnel is up" if up else (out["reason"] or f"the tunnel is {out['state']}"),
            previous,
            now,
        ),
    ]
    return out


def peer_statuses(
    gateway_status: Mapping[str, Any], *, previous: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, dict[str, Any]]:
    """Peer name -> its status, for every peer in a VPNGateway's published status (``tunnels`` or
    ``peers``: one entry per planned VPNPeer, by name, in the gateway's namespace)."""
    entries = [*(gateway_status.get("tunnels") or ()), *(gateway_status.get("peers") or ())]
    return {
        str(e["name"]): peer_status(e, previous=previous.get(str(e["name"])), now=now)
        for e in entries
        if isinstance(e, Mapping) and e.get("name")
    }
