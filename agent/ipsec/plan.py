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
* for a tunnel authenticating with certificates, a certificate or private key (a CA, the gateway's own)
  changed version or left the plan.

A change the agent cannot compare (what charon held before this agent connected, reported ``unknown``)
cuts nothing.

Certificates and private keys (pubkey authentication) are loaded like secrets, keyed ``cert/<id>`` and
``key/<id>`` with the version of their Secret file: a renewed certificate (cert-manager rotating the
``kubernetes.io/tls`` Secret) is loaded again; charon finds our certificate by the IKE identity in its
subjectAltName. Trust in peers' certificates is pinned per connection: every CA charon holds (``load-cert``
flag CA) is a trust anchor for EVERY connection, and a remote auth round without ``cacerts`` accepts a
chain to any of them. So each certificate-authenticated tunnel names its CAs (``Tunnel.peer_cas``) and its
conn is loaded with their PEM as ``cacerts`` in each such remote round (``with_cacerts``; a constraint on
the exact certificate, not its name: a rotated CA usually keeps its subject). Compared and recorded, the
conn carries ``cert/<id>@<version>`` there instead of the PEM (``compared_conn``), so a CA renewed in its
Secret reloads (and cuts) the conns pinned to it.

Nothing forgets a credential but ``clear-creds``: VICI cannot unload a certificate by id, ``load-cert``
adds to a set only ``clear-creds`` (or a restart) empties, and a CA stays a trust anchor while charon
holds it. So when a certificate or key changes or leaves the plan, or charon may hold credentials this
agent did not load (``Loaded.creds_unknown``: it connected to a daemon it had not filled itself), the
keeper clears them all (``Changes.clear_creds``: certificates, keys, CAs, and the shared keys too, which
live in the same set) and loads everything the plan still has at once; the window in which charon holds
none is what docs/agent.md measures.

A restarted charon has forgotten everything: the keeper then starts from an empty ``Loaded``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
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
    """conn name -> the ``load-conn`` payload loaded (its ``compared_conn`` form: pinned CAs by key and
    version, never their PEM), what a change is compared against (``cuts``); absent when not known."""
    creds_unknown: bool = False
    """charon may hold certificates or private keys this agent did not load: it connected to a daemon it
    had not filled itself, which lists some (an earlier agent process's CA, since withdrawn by the plan,
    could be one; VICI lists them without our ids and versions). The next apply clears every credential
    first (``Changes.clear_creds``)."""


@dataclass(frozen=True)
class Desired:
    conns: Mapping[str, Mapping[str, Any]]
    """conn name -> load-conn payload ``{name: {...}}``."""
    secrets: Mapping[str, IkeSecret]
    tunnels: tuple[Tunnel, ...]
    creds: Mapping[str, IkeCertificate | IkePrivateKey] = field(default_factory=dict)
    """``cert/<id>`` or ``key/<id>`` -> what to load with ``load-cert`` / ``load-key``."""
    pins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """conn name -> the ``cert/<id>`` keys of the CAs its peer's certificate must chain to (its
    ``Tunnel.peer_cas``); only conns that authenticate their peer with certificates are here."""


@dataclass(frozen=True)
class Changes:
    load_secrets: tuple[str, ...] = ()
    unload_secrets: tuple[str, ...] = ()
    load_conns: tuple[str, ...] = ()
    unload_conns: tuple[str, ...] = ()
    """Unload and terminate: removed from the plan."""
    load_creds: tuple[str, ...] = ()
    """Certificates and keys to (re)load, before any connection that may authenticate with them."""
    clear_creds: tuple[str, ...] = ()
    """Why charon must forget every credential first (``clear-creds``): the ``cert/<id>`` and ``key/<id>``
    replaced or withdrawn, or ``unknown`` (``Loaded.creds_unknown``). Empty: nothing to forget. When set,
    ``load_creds`` and ``load_secrets`` list everything the plan has (the clear drops shared keys too)."""

    @property
    def empty(self) -> bool:
        return not (
            self.load_secrets
            or self.unload_secrets
            or self.load_conns
            or self.unload_conns
            or self.load_creds
            or self.clear_creds
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
    pins = {t.name: _pins(f"ipsec.tunnels[{i}]", t, creds) for i, t in enumerate(plan.ipsec.tunnels)}
    return Desired(conns, secrets, plan.ipsec.tunnels, creds, {n: p for n, p in pins.items() if p})


QUIET = {"start_action": "none"}
"""What a standby's children load with: charon starts nothing by itself (``start`` would initiate at load,
``trap`` on the first packet to the remote subnet). ``dpd_action`` and ``close_action`` act on an existing
SA only, and a standby has none (the keeper terminates any)."""


def for_role(want: Desired, *, standby: bool) -> Desired:
    """``want`` as a pod in that HA role loads it (pure). Active: as it is. Standby: every child with
    ``start_action none`` (``QUIET``), so charon never initiates by itself while the agent holds back; the
    controller renders ``none`` anyway, so for its plans both roles load the same payloads (no reload on a
    role change: promotion costs no ``load-conn``). ``start_action`` is harmless to a change (``cuts``)."""
    if not standby:
        return want
    conns: dict[str, Mapping[str, Any]] = {}
    for name, conn in want.conns.items():
        quiet: dict[str, Any] = {}
        for n, body in conn.items():
            children = body.get("children") if isinstance(body, Mapping) else None
            if not isinstance(children, Mapping) or all(
                isinstance(c, Mapping) and c.get("start_action", "none") == "none" for c in children.values()
            ):
                quiet[n] = body
                continue
            quiet[n] = {
                **body,
                "children": {
                    c: {**child, **QUIET} if isinstance(child, Mapping) else child
                    for c, child in children.items()
                },
            }
        conns[name] = quiet
    return Desired(conns, want.secrets, want.tunnels, want.creds, want.pins)


def _pins(where: str, t: Tunnel, creds: Mapping[str, IkeCertificate | IkePrivateKey]) -> tuple[str, ...]:
    """The ``cert/<id>`` keys ``t``'s peer must chain to; raises PlanRejected when a certificate-authenticated
    tunnel names none (any CA charon holds would vouch for its peer) or names what is not a CA of the plan."""
    body = t.conn[t.name]
    for key in _cert_remote_rounds(body):
        if "cacerts" in body[key]:
            raise PlanRejected(f"{where}.conn.{t.name}.{key}.cacerts: the agent sets it from peerCas")
    if not _cert_remote_rounds(body):
        if t.peer_cas is not None:
            raise PlanRejected(f"{where}.peerCas: conn {t.name!r} authenticates its peer by PSK")
        return ()
    if not t.peer_cas:
        raise PlanRejected(
            f"{where}.peerCas: conn {t.name!r} authenticates its peer by certificate but names no CA "
            "(every CA charon holds would vouch for it)"
        )
    keys = []
    for j, cid in enumerate(t.peer_cas):
        cert = creds.get(f"cert/{cid}")
        if not isinstance(cert, IkeCertificate) or not cert.ca:
            raise PlanRejected(f"{where}.peerCas[{j}]: {cid!r} is not a CA of ipsec.certificates")
        keys.append(f"cert/{cid}")
    return tuple(dict.fromkeys(keys))


def with_cacerts(conn: Mapping[str, Any], cacerts: Sequence[str | bytes]) -> dict[str, Any]:
    """The ``load-conn`` payload ``conn`` (``{name: body}``) with ``cacerts`` set to ``cacerts`` in each
    remote auth round that authenticates by certificate (pure; ``conn`` is not changed)."""
    out: dict[str, Any] = {}
    for name, body in conn.items():
        body = dict(body)
        for key in _cert_remote_rounds(body):
            body[key] = {**body[key], "cacerts": list(cacerts)}
        out[name] = body
    return out


def compared_conn(want: Desired, name: str, cred_versions: Mapping[str, str]) -> Mapping[str, Any] | None:
    """Conn ``name`` as it is digested, recorded and compared: the plan's payload with its pinned CAs as
    ``cert/<id>@<version>`` in ``cacerts`` (the keeper loads their PEM there). None when a pinned CA cannot
    be read: loading the conn without it would trust every CA, so it is left as it is."""
    pins = want.pins.get(name, ())
    if not pins:
        return want.conns[name]
    if any(k not in cred_versions for k in pins):
        return None
    return with_cacerts(want.conns[name], [f"{k}@{cred_versions[k]}" for k in pins])


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
    cv = cred_versions or {}
    load_conns = []
    for n in sorted(want.conns):
        compared = compared_conn(want, n, cv)
        if compared is not None and loaded.conns.get(n) != conn_digest(compared):
            load_conns.append(n)
    unload_conns = sorted(set(loaded.conns) - set(want.conns))
    clear = withdrawn_creds(loaded, want, cv) + ((UNKNOWN,) if loaded.creds_unknown else ())
    if clear:
        # clear-creds drops every certificate, key and shared key: load all the plan has, changed or not.
        load_creds = sorted(k for k in want.creds if k in cv)
        load_secrets = sorted(sid for sid in want.secrets if sid in versions)
    else:
        load_creds = sorted(k for k in want.creds if k in cv and loaded.creds.get(k) != cv[k])
    return Changes(
        tuple(load_secrets),
        tuple(unload_secrets),
        tuple(load_conns),
        tuple(unload_conns),
        tuple(load_creds),
        clear,
    )


def withdrawn_creds(loaded: Loaded, want: Desired, cred_versions: Mapping[str, str]) -> tuple[str, ...]:
    """The certificates and keys charon holds that the plan replaced (a new version) or dropped: only
    ``clear-creds`` makes charon forget them. One whose Secret cannot be read now is neither (kept)."""
    return tuple(
        k
        for k, version in sorted(loaded.creds.items())
        if version != UNKNOWN
        and (k not in want.creds or (k in cred_versions and cred_versions[k] != version))
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


def _pinned_keys(body: Mapping[str, Any]) -> set[str]:
    """The ``cert/<id>`` keys a recorded (``compared_conn``) body pins in its remote rounds' ``cacerts``."""
    return {
        str(pin).rpartition("@")[0]
        for key in _cert_remote_rounds(body)
        for pin in body[key].get("cacerts") or ()
    }


def _cert_remote_rounds(body: Mapping[str, Any]) -> list[str]:
    """The keys of the remote auth rounds (``remote``, ``remote-N``) that are not a PSK: the peer may prove
    itself with a certificate there (charon's default ``auth`` is ``pubkey``)."""
    return sorted(
        k
        for k, v in body.items()
        if isinstance(v, Mapping)
        and (k == "remote" or k.startswith("remote-"))
        and str(v.get("auth", "pubkey")) != "psk"
    )


@dataclass(frozen=True)
class Cut:
    """A tunnel whose established IKE_SA(s) must be terminated after the new config and key are loaded."""

    tunnel: str
    why: tuple[str, ...]
    """What changed: conn fields (``remote``, ``children.<child>.remote_ts``), ``psk-rotated:<id>``,
    ``psk-ref:<id>``, ``psk-owners:<id>``, ``psk-removed:<id>``, ``cert/<id>``, ``key/<id>`` (a new
    version), ``removed:cert/<id>``, ``removed:key/<id>``. Never a key value."""


def cuts(
    loaded: Loaded, want: Desired, versions: Mapping[str, str], cred_versions: Mapping[str, str] | None = None
) -> tuple[Cut, ...]:
    """The tunnels of ``want`` that were loaded before and whose SAs a change from ``loaded`` must cut
    (see the module docstring); ``versions`` and ``cred_versions`` as for ``diff``: a secret whose value
    cannot be read is neither reloaded nor a reason to cut."""
    why: dict[str, list[str]] = {}
    cv = cred_versions or {}
    bodies = {t.name: t.conn[t.name] for t in want.tunnels}
    # Only tunnels that were loaded can have an SA; a removed one is unloaded and terminated anyway.
    known = [n for n in bodies if n in loaded.conns]
    for name in known:
        old = loaded.bodies.get(name)
        new = compared_conn(want, name, cv)
        if old is not None and new is not None and loaded.conns[name] != conn_digest(new):
            why.setdefault(name, []).extend(conn_cut(old, new[name]))

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
    # A CA vouched only for the tunnels pinned to it; our own certificate or key (or what cannot be told
    # apart from it: a dropped credential no tunnel was pinned to) for every certificate tunnel.
    pinned = {n: _pinned_keys(loaded.bodies.get(n, {})) for n in known}
    for k in withdrawn_creds(loaded, want, cv):
        reason = k if k in want.creds else f"removed:{k}"
        users = [n for n in known if k in pinned[n]]
        cred = want.creds.get(k)
        if not users and not (isinstance(cred, IkeCertificate) and cred.ca):
            users = [n for n in known if _uses_certificates(bodies[n])]
        for name in users:
            why.setdefault(name, []).append(reason)
    return tuple(Cut(n, tuple(dict.fromkeys(why[n]))) for n in known if why.get(n))
