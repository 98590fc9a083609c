"""What charon should have loaded, the smallest set of VICI calls that gets it there, and which tunnels a
change must cut (pure).

The agent remembers what it loaded into the charon it is talking to (``Loaded``: conn name -> digest and
payload of the ``load-conn`` call, shared-secret id -> owners + Secret reference + secret version). A new
plan or a rotated secret is applied by ``diff``: new and changed connections are loaded, removed ones
unloaded AND terminated (charon's ``unload-conn`` leaves established SAs running, LAB-FACTS), unchanged
ones are not touched at all, so their IKE_SAs keep their unique ids. A changed secret is loaded again under
the same id, which replaces the key.

Loading alone never revokes anything: charon keeps established SAs across a changed conn (strongSwan
5.9.8 ``vici_config.c`` ``merge_config`` replaces the config and undoes start actions only, and with
``start_action none`` there are none) and across a replaced key; rekeys inherit the config the SA was set
up with (``ike_sa.c`` ``inherit_pre``) and never use the PSK again, and no reauth is configured. So
``cuts`` names the tunnels whose established IKE_SA was set up under something the plan has withdrawn, for
the keeper to terminate once the new config and key are loaded (a site comes back through the watchdog,
a road warrior dials again):

* the conn changed in who the peer is or what it may reach (``conn_cut``): an auth round (``local*``,
  ``remote*``: ids, auth method, certificates), ``remote_addrs``, a surviving child's traffic selectors or
  mode, an IKE or ESP proposal removed, or any field not known to be harmless (fail closed);
* its PSK was rotated (a new version), moved to another Secret reference, given other owners, or unloaded
  while the tunnel stays: a rotation means the old key may be known to someone else;
* for a tunnel authenticating with certificates, a certificate or private key (the CA, the gateway's own)
  changed version.

A change the agent cannot compare (what charon held before this agent connected, reported ``unknown``)
cuts nothing.

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

from gwplan import IkeCertificate, IkePrivateKey, IkeSecret, Plan, SecretRef, Tunnel

UNKNOWN = "unknown"
"""Digest or version of what charon held before this agent connected: reloaded, never compared."""


def conn_digest(conn: Mapping[str, Any]) -> str:
    """Digest of a ``load-conn`` payload (canonical JSON)."""
    return hashlib.sha256(json.dumps(conn, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SecretState:
    owners: tuple[str, ...]
    version: str
    """``Secrets.version`` of the value: a digest, never the value (``UNKNOWN``: not loaded by us)."""
    ref: SecretRef | None = None
    """The Secret name/key the value was read from (None: not loaded by us)."""


@dataclass(frozen=True)
class Loaded:
    """What the agent loaded into the current charon."""

    conns: Mapping[str, str] = field(default_factory=dict)
    """conn name -> conn_digest."""
    secrets: Mapping[str, SecretState] = field(default_factory=dict)
    """shared-secret id -> owners, version and Secret reference."""
    creds: Mapping[str, str] = field(default_factory=dict)
    """``cert/<id>`` or ``key/<id>`` -> version of the Secret file loaded."""
    bodies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """conn name -> the ``load-conn`` payload loaded, what a change is compared against (``cuts``);
    absent when not known."""


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
        if loaded.secrets.get(sid) != SecretState(s.owners, versions[sid], s.ref):
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


# --- what a change must cut -------------------------------------------------------------------------------

CONN_HARMLESS = frozenset(
    {
        "local_addrs",  # our own addresses (NIC2's), not who the peer is nor what it reaches
        "local_port",
        "rekey_time",
        "reauth_time",
        "over_time",
        "rand_time",
        "dpd_delay",
        "dpd_timeout",
        "keyingtries",
        "mobike",
        "fragmentation",
        "send_certreq",
        "send_cert",
        "encap",
        "dscp",
    }
)
"""Top-level ``load-conn`` fields whose change never cuts: timers and transport details. They apply to SAs
set up later (an established one keeps the values it was set up with). Any other field cuts when it
changes: fail closed for fields added later."""

CHILD_HARMLESS = frozenset(
    {
        "start_action",
        "dpd_action",
        "close_action",
        "rekey_time",
        "life_time",
        "rand_time",
        "rekey_bytes",
        "life_bytes",
        "rand_bytes",
        "rekey_packets",
        "life_packets",
        "rand_packets",
        "inactivity",
        "replay_window",
        "updown",
    }
)
"""A child's fields whose change never cuts (timers, actions); ``local_ts``, ``remote_ts``, ``mode`` and
everything not listed do."""

PROPOSALS = frozenset({"proposals", "esp_proposals", "ah_proposals"})
"""Cut only when a proposal is removed (or the field appears or disappears: charon's default set is not
ours to compare): the SA may be using the removed algorithm and its rekeys would keep it forever. A
proposal added or reordered changes only what a new SA may negotiate."""


def _field_cut(name: str, old: Any, new: Any, harmless: frozenset[str]) -> bool:
    if old == new or name in harmless:
        return False
    if name in PROPOSALS and isinstance(old, list) and isinstance(new, list):
        return bool(set(map(str, old)) - set(map(str, new)))
    return True


def conn_cut(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """Why loading ``new`` over ``old`` (one conn's body, the value of ``{name: body}``) must cut the SAs
    set up under ``old``: the changed fields that matter, as ``field`` or ``children.<child>.<field>``;
    empty when none does. Children added or removed are not a reason: an added child is initiated under
    the same IKE_SA, a removed one's CHILD_SA is terminated alone (``stale_children``)."""
    why: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key == "children":
            continue
        if _field_cut(key, old.get(key), new.get(key), CONN_HARMLESS):
            why.append(key)
    old_children = old.get("children") or {}
    new_children = new.get("children") or {}
    for child in sorted(set(old_children) & set(new_children)):
        before, after = old_children[child] or {}, new_children[child] or {}
        for key in sorted(set(before) | set(after)):
            if _field_cut(key, before.get(key), after.get(key), CHILD_HARMLESS):
                why.append(f"children.{child}.{key}")
    return tuple(why)


def _auth_rounds(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The conn's authentication rounds: ``local``/``local-N`` and ``remote``/``remote-N`` sections."""
    return [
        v
        for k, v in body.items()
        if isinstance(v, Mapping) and (k in ("local", "remote") or k.startswith(("local-", "remote-")))
    ]


def _remote_ids(body: Mapping[str, Any]) -> set[str]:
    rounds = [
        v for k, v in body.items() if isinstance(v, Mapping) and (k == "remote" or k.startswith("remote-"))
    ]
    return {str(r["id"]) for r in rounds if "id" in r}


def _uses_certificates(body: Mapping[str, Any]) -> bool:
    """Any auth round that is not a PSK (pubkey, rsa, ecdsa, eap-tls ...) may rest on a certificate."""
    return any(str(r.get("auth", "pubkey")) != "psk" for r in _auth_rounds(body))


@dataclass(frozen=True)
class Cut:
    """A tunnel whose established IKE_SA(s) must be terminated after the new config and key are loaded."""

    tunnel: str
    why: tuple[str, ...]
    """What changed: conn fields (``remote``, ``children.<child>.remote_ts``), ``psk-rotated:<id>``,
    ``psk-ref:<id>``, ``psk-owners:<id>``, ``psk-removed:<id>``, ``cert/<id>``, ``key/<id>``. Never a
    key value."""


def cuts(
    loaded: Loaded, want: Desired, versions: Mapping[str, str], cred_versions: Mapping[str, str] | None = None
) -> tuple[Cut, ...]:
    """The tunnels of ``want`` that were loaded before and whose SAs a change from ``loaded`` must cut
    (see the module docstring); ``versions`` and ``cred_versions`` as for ``diff``: a secret whose value
    cannot be read is neither reloaded nor a reason to cut."""
    why: dict[str, list[str]] = {}
    bodies = {t.name: t.conn[t.name] for t in want.tunnels}
    # Only tunnels that were loaded can have an SA; a removed one is unloaded and terminated anyway.
    known = [n for n in bodies if n in loaded.conns]
    for name in known:
        old = loaded.bodies.get(name)
        if old is not None and loaded.conns[name] != conn_digest(want.conns[name]):
            why.setdefault(name, []).extend(conn_cut(old, bodies[name]))

    def keyed_by(owners: set[str]) -> list[str]:
        return [n for n in known if _remote_ids(bodies[n]) & owners]

    for sid, before in sorted(loaded.secrets.items()):
        if before.version == UNKNOWN:
            continue
        s = want.secrets.get(sid)
        if s is None:
            reasons = [f"psk-removed:{sid}"]
        elif sid not in versions:
            continue
        else:
            reasons = [
                *([f"psk-rotated:{sid}"] if versions[sid] != before.version else []),
                *([f"psk-ref:{sid}"] if before.ref is not None and before.ref != s.ref else []),
                *([f"psk-owners:{sid}"] if before.owners != s.owners else []),
            ]
        if reasons:
            for name in keyed_by(set(before.owners) | set(s.owners if s else ())):
                why.setdefault(name, []).extend(reasons)
    cv = cred_versions or {}
    changed_creds = sorted(
        k for k in want.creds if k in cv and loaded.creds.get(k) not in (None, UNKNOWN, cv[k])
    )
    if changed_creds:
        for name in known:
            if _uses_certificates(bodies[name]):
                why.setdefault(name, []).extend(changed_creds)
    return tuple(Cut(n, tuple(dict.fromkeys(why[n]))) for n in known if why.get(n))
