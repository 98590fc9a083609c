"""What charon should have loaded, and the smallest set of VICI calls that gets it there (pure).

The agent remembers what it loaded into the charon it is talking to (``Loaded``: conn name -> digest of
the ``load-conn`` payload, shared-secret id -> owners + secret version). A new plan or a rotated secret is
applied by ``diff``: new and changed connections are loaded, removed ones unloaded AND terminated (charon's
``unload-conn`` leaves established SAs running, LAB-FACTS), unchanged ones are not touched at all, so their
IKE_SAs keep their unique ids. A changed secret is loaded again under the same id, which replaces the key
without touching established SAs (they never use the PSK again until a reauth).

Certificates and private keys (pubkey authentication) are loaded like secrets, keyed ``cert/<id>`` and
``key/<id>`` with the version of their Secret file: a renewed certificate (cert-manager rotating the
``kubernetes.io/tls`` Secret) is loaded again; charon finds our certificate by the IKE identity in its
subjectAltName and trusts peers' certificates through the CA loaded with flag CA. VICI cannot unload a
certificate by id, so one removed from the plan stays in charon's memory until charon restarts; no
connection refers to it any more.

A restarted charon has forgotten everything: the keeper then starts from an empty ``Loaded``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gwplan import IkeCertificate, IkePrivateKey, IkeSecret, Plan, Tunnel


def conn_digest(conn: Mapping[str, Any]) -> str:
    """Digest of a ``load-conn`` payload (canonical JSON)."""
    return hashlib.sha256(json.dumps(conn, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SecretState:
    owners: tuple[str, ...]
    version: str
    """``Secrets.version`` of the value: a digest, never the value."""


@dataclass(frozen=True)
class Loaded:
    """What the agent loaded into the current charon."""

    conns: Mapping[str, str] = field(default_factory=dict)
    """conn name -> conn_digest."""
    secrets: Mapping[str, SecretState] = field(default_factory=dict)
    """shared-secret id -> owners and version."""
    creds: Mapping[str, str] = field(default_factory=dict)
    """``cert/<id>`` or ``key/<id>`` -> version of the Secret file loaded."""


@dataclass(frozen=True)
class Desired:
    conns: Mapping[str, Mapping[str, Any]]
    """conn name -> load-conn payload ``{name: {...}}``."""
    secrets: Mapping[str, IkeSecret]
    tunnels: tuple[Tunnel, ...]
    creds: Mapping[str, IkeCertificate | IkePrivateKey] = field(default_factory=dict)
    """``cert/<id>`` or ``key/<id>`` -> what to load with ``load-cert`` / ``load-key``."""


@dataclass(frozen=True)
class Changes:
    load_secrets: tuple[str, ...] = ()
    unload_secrets: tuple[str, ...] = ()
    load_conns: tuple[str, ...] = ()
    unload_conns: tuple[str, ...] = ()
    """Unload and terminate: removed from the plan."""
    load_creds: tuple[str, ...] = ()
    """Certificates and keys to (re)load, before any connection that may authenticate with them."""

    @property
    def empty(self) -> bool:
        return not (
            self.load_secrets
            or self.unload_secrets
            or self.load_conns
            or self.unload_conns
            or self.load_creds
        )


class PlanRejected(ValueError):
    """The plan is valid JSON but cannot drive charon; names the field and the rule."""


def desired(plan: Plan) -> Desired:
    """The plan's IPsec part, checked for what the agent relies on; raises PlanRejected."""
    if plan.ipsec is None:
        return Desired({}, {}, ())
    conns: dict[str, Mapping[str, Any]] = {}
    for i, t in enumerate(plan.ipsec.tunnels):
        where = f"ipsec.tunnels[{i}]"
        if t.name in conns:
            raise PlanRejected(f"{where}.name: {t.name!r} is used twice")
        if set(t.conn) != {t.name}:
            raise PlanRejected(f"{where}.conn: must be one connection named {t.name!r}")
        body = t.conn[t.name]
        if not isinstance(body, Mapping):
            raise PlanRejected(f"{where}.conn.{t.name}: expected an object")
        loaded_children = set((body.get("children") or {}).keys())
        for j, c in enumerate(t.children):
            if c.name not in loaded_children:
                raise PlanRejected(
                    f"{where}.children[{j}].name: {c.name!r} is not a child of conn {t.name!r}"
                )
        conns[t.name] = t.conn
    secrets: dict[str, IkeSecret] = {}
    for i, s in enumerate(plan.ipsec.secrets):
        if s.id in secrets:
            raise PlanRejected(f"ipsec.secrets[{i}].id: {s.id!r} is used twice")
        secrets[s.id] = s
    creds: dict[str, IkeCertificate | IkePrivateKey] = {}
    listed: list[tuple[str, str, int, IkeCertificate | IkePrivateKey]] = [
        *(("certificates", "cert", i, c) for i, c in enumerate(plan.ipsec.certificates)),
        *(("privateKeys", "key", i, k) for i, k in enumerate(plan.ipsec.private_keys)),
    ]
    for field_name, prefix, i, item in listed:
        key = f"{prefix}/{item.id}"
        if key in creds:
            raise PlanRejected(f"ipsec.{field_name}[{i}].id: {item.id!r} is used twice")
        creds[key] = item
    return Desired(conns, secrets, plan.ipsec.tunnels, creds)


def diff(
    loaded: Loaded, want: Desired, versions: Mapping[str, str], cred_versions: Mapping[str, str] | None = None
) -> Changes:
    """Calls needed to go from ``loaded`` to ``want``; ``versions``: secret id -> current version (ids
    whose value cannot be read are absent: they are left as they are, neither loaded nor unloaded);
    ``cred_versions`` likewise for ``cert/<id>`` and ``key/<id>``."""
    load_secrets = []
    for sid, s in sorted(want.secrets.items()):
        if sid not in versions:
            continue
        if loaded.secrets.get(sid) != SecretState(s.owners, versions[sid]):
            load_secrets.append(sid)
    unload_secrets = sorted(set(loaded.secrets) - set(want.secrets))
    load_conns = sorted(n for n, c in want.conns.items() if loaded.conns.get(n) != conn_digest(c))
    unload_conns = sorted(set(loaded.conns) - set(want.conns))
    cv = cred_versions or {}
    load_creds = sorted(k for k in want.creds if k in cv and loaded.creds.get(k) != cv[k])
    return Changes(
        tuple(load_secrets), tuple(unload_secrets), tuple(load_conns), tuple(unload_conns), tuple(load_creds)
    )


def stale_children(
    tunnels: tuple[Tunnel, ...], sas: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """CHILD_SAs (conn name, child unique id) whose child config the plan no longer has: a reload that
    removed a subnet must tear its SA down (loading the changed conn alone does not)."""
    wanted = {t.name: {c.name for c in t.children} for t in tunnels}
    out = []
    for sa in sas.values():
        names = wanted.get(str(sa.get("name")))
        if names is None:
            continue
        for child in (sa.get("child-sas") or {}).values():
            if child.get("name") not in names and child.get("state") in ("INSTALLED", "REKEYING"):
                out.append((str(sa.get("name")), str(child.get("uniqueid"))))
    return sorted(out)
