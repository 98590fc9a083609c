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
      "lastError": null,                 the last apply's failure (rejected plan, kernel step), else null
      "updatedAt": "2026-01-01T00:00:00Z"  when the content last changed (the writer adds it)
    }

Lists are sorted, so the same state gives the same bytes and the writer can skip unchanged content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from initnat.rules import Kept, LeftOut

VERSION = "initnat-status/v1"


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
) -> dict[str, Any]:
    return {
        "version": VERSION,
        "planHash": plan_hash,
        "leftOut": [left_out_entry(x) for x in sorted(left_out, key=lambda x: (x.field, x.exposure))],
        "keptTargets": [
            {"host": k.host, "address": str(k.address), "reason": k.reason} for k in sorted(kept)
        ],
        "lastError": last_error,
    }


def render(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False).encode() + b"\n"
