"""swanctl.conf text equivalent to a plan's IPsec part, for humans (and ``swanctl --load-all``).

The plan's VICI dicts are the source: each section and key/value is written as swanctl.conf syntax, so the
two forms cannot drift. No secret value is written: each IKE secret becomes a comment naming the Secret
key it comes from, and an ``include`` of ``secrets.d/*.conf`` where an operator (or a test) may put
``ike-<name> { secret = ... }`` files. A tunnel's pinned CAs (``peer_cas``, which the status-agent loads as
its remote round's ``cacerts`` from a Secret) are named in a comment above its conn: with swanctl, add
``cacerts = <file in x509ca/>`` there, or any CA loaded would vouch for the peer.

Values reaching this file were validated (allowlist patterns), but the writer does not rely on that: a
value that is not a plain token is double-quoted with backslash escapes, and a value that cannot be
represented safely (control characters) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gwplan

_TOKEN = re.compile(r"[A-Za-z0-9%@._:/+\-]+")
_SECTION = re.compile(r"[A-Za-z0-9_\-]+")


class UnsafeValue(ValueError):
    """A value or section name cannot be written to swanctl.conf without changing its meaning."""


def _value(v: Any) -> str:
    if isinstance(v, list | tuple):
        if any("," in str(x) for x in v):
            raise UnsafeValue(f"list item in {v!r} contains a comma (swanctl.conf splits lists on commas)")
        return ",".join(_value(x) for x in v)
    text = str(v)
    if _TOKEN.fullmatch(text):
        return text
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise UnsafeValue(f"value {text!r} contains control characters")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _section(name: str) -> str:
    if not _SECTION.fullmatch(name):
        raise UnsafeValue(f"section name {name!r} is not safe in swanctl.conf")
    return name


def _write(lines: list[str], body: Mapping[str, Any], depth: int) -> None:
    pad = "    " * depth
    for key in sorted(k for k, v in body.items() if not isinstance(v, Mapping)):
        lines.append(f"{pad}{_section(key)} = {_value(body[key])}")
    for key in sorted(k for k, v in body.items() if isinstance(v, Mapping)):
        lines.append(f"{pad}{_section(key)} {{")
        _write(lines, body[key], depth + 1)
        lines.append(f"{pad}}}")


def render_swanctl(plan: gwplan.Plan, secrets_include: str = "secrets.d/*.conf") -> str:
    """swanctl.conf for ``plan`` (an IPsec plan); raises ValueError for a WireGuard plan."""
    if plan.ipsec is None:
        raise ValueError(
            f"{plan.gateway.kind}/{plan.gateway.namespace}/{plan.gateway.name} is not an IPsec gateway"
        )
    g = plan.gateway
    lines = [
        f"# swanctl.conf for {g.kind}/{g.namespace}/{g.name}, rendered from plan {gwplan.plan_hash(plan)}",
        "# Equivalent to the plan's VICI load-conn payloads. Secret VALUES are not here (see secrets).",
        "connections {",
    ]
    cas = {c.id: c for c in plan.ipsec.certificates if c.ca}
    for tunnel in plan.ipsec.tunnels:
        for cid in tunnel.peer_cas or ():
            ca = cas.get(cid)
            where = f"Secret {ca.ref.name}, key {ca.ref.key}" if ca else "not in the plan"
            lines.append(
                f"    # {_section(tunnel.name)}: remote cacerts = CA {_value(cid)} ({where}), "
                "pinned by the status-agent"
            )
        _write(lines, tunnel.conn, 1)
    lines.append("}")
    lines.append("secrets {")
    for s in plan.ipsec.secrets:
        owners = ", ".join(s.owners)
        lines.append(f"    # ike-{s.id}: ids {owners}; secret from Secret {s.ref.name}, key {s.ref.key}")
    for c in plan.ipsec.certificates:
        lines.append(
            f"    # certificate {c.id}{' (CA)' if c.ca else ''}: Secret {c.ref.name}, key {c.ref.key}"
        )
    for k in plan.ipsec.private_keys:
        lines.append(f"    # private key {k.id}: Secret {k.ref.name}, key {k.ref.key}")
    lines.append(f"    include {secrets_include}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def secret_section(secret: gwplan.IkeSecret, value: str) -> str:
    """An ``ike-<id>`` section for a secrets.d file (used by whoever holds the value, e.g. a test)."""
    owners = "".join(f"        id-{i} = {_value(o)}\n" for i, o in enumerate(secret.owners))
    return f"ike-{_section(secret.id)} {{\n        secret = {_value(value)}\n{owners}    }}\n"
