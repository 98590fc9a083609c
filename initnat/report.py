"""What init-nat tells the rest of the pod about its state: one small JSON document (pure).

init-nat has no API of its own; the status-agent owns the CR's status. So init-nat writes this document
to a file (``--status-file``, by default ``initnat-status.json`` next to the plan: in the pod that is the
live directory the status-agent writes the plan to and reads from), and the agent can surface it::

    {
      "version": "initnat-status/v1",
      "planHash": "sha256:...",          the plan whose rules are in the kernel (null: none applied yet)
      "leftOut": [                       exposures of that plan NOT in the rules, with their grants
        {"exposure": "db", "field": "nat.exposures[1].targetHost", "virtualIp": "198.18.0.11",
         "host": "db.example", "reason": "db.example does not resolve: ...",
         "grants": [{"peer": "s1", "mark": "0x20000"}]}
      ],
      "keptTargets": [                   names DNS could not answer this time that keep their address
        {"host": "api.example", "address": "192.0.2.70", "reason": "no answer within 2 s"}
      ],
      "ipv6": {"state": "guarded"},      IPv6 on NIC2 and the tunnels (rules.ipv6_rules): guarded, absent
                                         (the kernel has none here), or unguarded with its "reason"
      "role": "active",                  the HA role whose rules are in the kernel (rules.standby_rules:
                                         "standby" drops IKE/ESP or the WireGuard port on NIC2); absent
                                         until an apply went in
      "lastError": null,                 the last apply's failure (rejected plan, kernel step), else null
      "updatedAt": "2026-01-01T00:00:00Z"  when the content last changed (the writer adds it)
    }

Lists are sorted, so the same state gives the same bytes and the writer can skip unchanged content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from initnat.rules import Kept, LeftOut

VERSION = "initnat-status/v1"


@dataclass(frozen=True)
class Ipv6:
    """What init-nat could do about IPv6 (rules.ipv6_rules) at the last apply."""

    state: Literal["guarded", "absent", "unguarded"]
    """guarded: ip6tables holds the rules; absent: the kernel has no IPv6 in this namespace (booted with
    ipv6.disable=1, or built without it), nothing to guard; unguarded: IPv6 is there and ip6tables could
    not be used (``reason``): a neighbour on NIC2 can reach the pod over IPv6."""
    reason: str | None = None


def left_out_entry(x: LeftOut) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "exposure": x.exposure,
        "field": x.field,
        "virtualIp": str(x.vip),
        "reason": x.reason,
        "grants": [{"peer": g.peer, "mark": f"{g.mark:#x}"} for g in sorted(x.grants, key=lambda g: g.mark)],
    }
    if x.host is not None:
        entry["host"] = x.host
    if x.kind != "exposure":
        entry["kind"] = x.kind
    return entry


def document(
    *,
    plan_hash: str | None,
    left_out: Iterable[LeftOut] = (),
    kept: Iterable[Kept] = (),
    last_error: str | None = None,
    ipv6: Ipv6 | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": VERSION,
        "planHash": plan_hash,
        "leftOut": [left_out_entry(x) for x in sorted(left_out, key=lambda x: (x.field, x.exposure))],
        "keptTargets": [
            {"host": k.host, "address": str(k.address), "reason": k.reason} for k in sorted(kept)
        ],
        "lastError": last_error,
    }
    if role is not None:
        doc["role"] = role
    if ipv6 is not None:
        doc["ipv6"] = {"state": ipv6.state, **({"reason": ipv6.reason} if ipv6.reason else {})}
    return doc


def render(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False).encode() + b"\n"
