"""Which tunnels a plan or key change must cut (agent.ipsec.plan.conn_cut, cuts), table-driven, no I/O.

charon keeps established SAs across a re-loaded conn or key (LAB-FACTS; strongSwan 5.9.8 merge_config),
so the keeper terminates what these functions name once the new config and key are loaded."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from agent.ipsec.plan import (
    UNKNOWN,
    Cut,
    Desired,
    Loaded,
    SecretState,
    compared_conn,
    conn_cut,
    conn_digest,
    cuts,
    desired,
)
from gwplan import Child, GatewayRef, IkeCertificate, IkePrivateKey, IkeSecret, Ipsec, Plan, SecretRef, Tunnel

GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw")
DROP = object()
"""Marks a field removed by ``changed``."""

BASE: dict[str, Any] = {
    "version": "2",
    "local_addrs": ["192.0.2.2"],
    "remote_addrs": ["198.51.100.2"],
    "proposals": ["aes256-sha256-modp2048", "aes128-sha256-modp2048"],
    "dpd_delay": "30s",
    "unique": "replace",
    "local": {"auth": "psk", "id": "gw.example"},
    "remote": {"auth": "psk", "id": "s1.example"},
    "children": {
        "s1-0": {
            "mode": "tunnel",
            "local_ts": ["198.18.0.0/24"],
            "remote_ts": ["10.1.0.0/24"],
            "esp_proposals": ["aes256gcm16-modp2048", "aes128gcm16-modp2048"],
            "start_action": "none",
            "dpd_action": "clear",
            "close_action": "none",
        }
    },
}


def changed(body: Mapping[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``body`` with the field at the dotted ``path`` set to ``value`` (``DROP``: removed)."""
    out = copy.deepcopy(dict(body))
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is DROP:
        del node[last]
    else:
        node[last] = value
    return out


CHILD = BASE["children"]["s1-0"]


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        # who the peer is
        pytest.param("remote.id", "s9.example", ("remote",), id="remote-id"),
        pytest.param("remote.auth", "pubkey", ("remote",), id="remote-auth"),
        pytest.param("remote.cacerts", ["other-ca"], ("remote",), id="remote-trust-anchor"),
        pytest.param("local.id", "gw2.example", ("local",), id="local-id"),
        pytest.param("remote-2", {"auth": "eap"}, ("remote-2",), id="second-round-added"),
        pytest.param("remote_addrs", ["198.51.100.6"], ("remote_addrs",), id="site-moved"),
        pytest.param("remote_addrs", ["%any"], ("remote_addrs",), id="site-to-road-warrior"),
        pytest.param("version", "1", ("version",), id="ike-version"),
        # what it may reach
        pytest.param(
            "children.s1-0.remote_ts", ["10.9.0.0/24"], ("children.s1-0.remote_ts",), id="remote-ts"
        ),
        pytest.param(
            "children.s1-0.local_ts", ["198.18.0.0/23"], ("children.s1-0.local_ts",), id="local-ts-widened"
        ),
        pytest.param("children.s1-0.mode", "transport", ("children.s1-0.mode",), id="child-mode"),
        # a proposal removed: the SA may be using it, and rekeys keep the SA's own config
        pytest.param("proposals", ["aes256-sha256-modp2048"], ("proposals",), id="ike-proposal-removed"),
        pytest.param(
            "children.s1-0.esp_proposals",
            ["aes128gcm16-modp2048"],
            ("children.s1-0.esp_proposals",),
            id="esp-proposal-removed",
        ),
        pytest.param("proposals", DROP, ("proposals",), id="proposals-to-charons-default"),
        # fail closed: a field not known to be harmless
        pytest.param("pools", ["rw-pool"], ("pools",), id="unknown-field-added"),
        pytest.param("unique", "never", ("unique",), id="unique-policy"),
        pytest.param("children.s1-0.if_id_in", "7", ("children.s1-0.if_id_in",), id="unknown-child-field"),
        # nothing that matters
        pytest.param("dpd_delay", "10s", (), id="dpd-delay"),
        pytest.param("rekey_time", "7200", (), id="rekey-time-added"),
        pytest.param("local_addrs", ["192.0.2.3"], (), id="our-own-address"),
        pytest.param(
            "proposals", ["aes128-sha256-modp2048", "aes256-sha256-modp2048"], (), id="proposals-reordered"
        ),
        pytest.param(
            "proposals", [*BASE["proposals"], "aes256gcm16-prfsha384-ecp384"], (), id="proposal-added"
        ),
        pytest.param(
            "children.s1-0.esp_proposals",
            [*CHILD["esp_proposals"], "aes256-sha256"],
            (),
            id="esp-proposal-added",
        ),
        pytest.param("children.s1-0.start_action", "trap", (), id="child-start-action"),
        pytest.param("children.s1-0.rekey_time", "20s", (), id="child-rekey-time"),
        pytest.param("children.s1-1", {"local_ts": ["198.18.0.0/24"]}, (), id="child-added"),
        pytest.param("children.s1-0", DROP, (), id="child-removed-alone-by-stale-children"),
    ],
)
def test_conn_cut(path: str, value: Any, why: tuple[str, ...]) -> None:
    assert conn_cut(BASE, changed(BASE, path, value)) == why


def test_conn_cut_names_every_field_that_matters_and_nothing_else() -> None:
    new = changed(
        changed(changed(BASE, "remote.id", "x.example"), "dpd_delay", "5s"), "remote_addrs", ["%any"]
    )
    assert conn_cut(BASE, new) == ("remote", "remote_addrs")
    assert conn_cut(BASE, copy.deepcopy(BASE)) == ()


# --- cuts: the plan as a whole ------------------------------------------------------------------------------

CA = IkeCertificate("ca", SecretRef("gw-tls", "ca.crt"), ca=True)
CERT = IkeCertificate("gateway", SecretRef("gw-tls", "tls.crt"))
KEY = IkePrivateKey("gateway", SecretRef("gw-tls", "tls.key"))


def tunnel(name: str, body: Mapping[str, Any] | None = None, *, initiate: bool = True) -> Tunnel:
    b = copy.deepcopy(dict(body or changed(BASE, "remote.id", f"{name}.example")))
    b["children"] = {f"{name}-0": b["children"].pop("s1-0")} if "s1-0" in b["children"] else b["children"]
    return Tunnel(name, initiate, tuple(Child(c, "10.1.0.0/24") for c in b["children"]), {name: b})


def pubkey(name: str, *cas: str) -> Tunnel:
    """A road warrior authenticating by certificate, pinned to ``cas`` (default: the plan's CA ``ca``)."""
    body = changed(
        changed(BASE, "remote", {"auth": "pubkey", "id": f"{name}.example"}), "local.auth", "pubkey"
    )
    return dataclasses.replace(tunnel(name, body, initiate=False), peer_cas=cas or ("ca",))


TENANT = SecretRef("tenant-psk", "psk")


def psk(name: str, ref: SecretRef = TENANT, owner: str | None = None) -> IkeSecret:
    return IkeSecret(f"psk-{name}", (owner or f"{name}.example",), ref)


def want(*tunnels: Tunnel, secrets: tuple[IkeSecret, ...] = (), tls: bool = False) -> Desired:
    certs, keys = ((CA, CERT), (KEY,)) if tls else ((), ())
    ipsec = Ipsec(secrets=secrets, tunnels=tunnels, certificates=certs, private_keys=keys)
    return desired(Plan(gateway=GW, type="ipsec", ipsec=ipsec))


def loaded(w: Desired, versions: Mapping[str, str], creds: Mapping[str, str] | None = None) -> Loaded:
    """What the keeper records after applying ``w`` with these secret and credential versions."""
    compared = {n: compared_conn(w, n, creds or {}) for n in w.conns}
    return Loaded(
        conns={n: conn_digest(c) for n, c in compared.items() if c is not None},
        secrets={sid: SecretState(s.owners, versions[sid], s.ref) for sid, s in w.secrets.items()},
        creds=dict(creds or {}),
        bodies={n: c[n] for n, c in compared.items() if c is not None},
    )


A, B = tunnel("a"), tunnel("b")
V1 = {"psk-a": "v1", "psk-b": "v1"}


def test_a_rotated_key_cuts_the_tunnel_it_keys_and_no_other() -> None:
    before = want(A, B, secrets=(psk("a"), psk("b", SecretRef("other", "psk"))))
    assert cuts(loaded(before, V1), before, {"psk-a": "v2", "psk-b": "v1"}) == (
        Cut("a", ("psk-rotated:psk-a",)),
    )


@pytest.mark.parametrize(
    ("loaded_state", "versions", "now", "expected"),
    [
        pytest.param(
            SecretState(("a.example",), "v1", TENANT), {"psk-a": "v1"}, psk("a"), (), id="unchanged"
        ),
        pytest.param(
            SecretState(("a.example",), "v1", TENANT),
            {"psk-a": "v2"},
            psk("a"),
            ("psk-rotated:psk-a",),
            id="rotated",
        ),
        pytest.param(
            SecretState(("a.example",), "v1", TENANT),
            {"psk-a": "v1"},
            psk("a", SecretRef("own-psk", "psk")),
            ("psk-ref:psk-a",),
            id="moved-to-another-secret-same-value",
        ),
        pytest.param(
            SecretState(("a.example",), "v1", TENANT),
            {"psk-a": "v2"},
            psk("a", SecretRef("own-psk", "psk")),
            ("psk-rotated:psk-a", "psk-ref:psk-a"),
            id="moved-to-another-secret",
        ),
        pytest.param(
            SecretState(("a.example",), "v1", TENANT), {}, psk("a"), (), id="unreadable-keeps-the-key-no-cut"
        ),
        pytest.param(
            SecretState((), UNKNOWN), {"psk-a": "v2"}, psk("a"), (), id="loaded-before-we-connected"
        ),
        pytest.param(
            SecretState(("a.example",), "v1", TENANT),
            {"psk-a": "v1"},
            None,
            ("psk-removed:psk-a",),
            id="removed",
        ),
    ],
)
def test_key_changes(
    loaded_state: SecretState, versions: dict[str, str], now: IkeSecret | None, expected: tuple[str, ...]
) -> None:
    w = want(A, secrets=(now,) if now else ())
    before = Loaded(
        conns={"a": conn_digest(A.conn)}, secrets={"psk-a": loaded_state}, bodies={"a": A.conn["a"]}
    )
    assert cuts(before, w, versions) == ((Cut("a", expected),) if expected else ())


def test_a_changed_identity_cuts_once_with_every_reason() -> None:
    before = want(A, B, secrets=(psk("a"), psk("b")))
    a2 = tunnel("a", changed(BASE, "remote.id", "a2.example"))
    after = want(a2, B, secrets=(psk("a", owner="a2.example"), psk("b")))
    assert cuts(loaded(before, V1), after, V1) == (Cut("a", ("remote", "psk-owners:psk-a")),)


def test_what_cannot_be_compared_or_never_ran_cuts_nothing() -> None:
    before = want(A, secrets=(psk("a"),))
    a2 = tunnel("a", changed(BASE, "remote.id", "a2.example"))
    c = tunnel("c")
    after = want(a2, c, secrets=(psk("a"), psk("c")))
    unknown = Loaded(conns={"a": UNKNOWN}, secrets={"psk-a": SecretState((), UNKNOWN)})
    assert cuts(unknown, after, {"psk-a": "v2", "psk-c": "v1"}) == (), "charon had it before we connected"
    # "c" is new (it has no SA), and "a" changed: only "a" is cut.
    assert cuts(loaded(before, {"psk-a": "v1"}), after, {"psk-a": "v1", "psk-c": "v9"}) == (
        Cut("a", ("remote",)),
    )


def test_a_removed_tunnel_is_not_cut_here() -> None:
    """unload-conn + terminate (Changes.unload_conns) handle it."""
    before = want(A, B, secrets=(psk("a"), psk("b")))
    assert cuts(loaded(before, V1), want(B, secrets=(psk("b"),)), V1) == ()


CREDS = {"cert/ca": "c1", "cert/gateway": "g1", "key/gateway": "k1"}


@pytest.mark.parametrize(
    ("was", "now", "expected"),
    [
        pytest.param(
            CREDS, {**CREDS, "cert/ca": "c2"}, ("remote", "cert/ca"), id="ca-changed-its-pin-with-it"
        ),
        pytest.param(CREDS, {**CREDS, "cert/gateway": "g2"}, ("cert/gateway",), id="gateway-cert-renewed"),
        pytest.param(CREDS, {**CREDS, "key/gateway": "k2"}, ("key/gateway",), id="gateway-key-changed"),
        pytest.param(CREDS, CREDS, (), id="unchanged"),
        pytest.param({}, CREDS, (), id="first-load"),
        pytest.param(CREDS, {"cert/gateway": "g1", "key/gateway": "k1"}, (), id="unreadable-ca-keeps-it"),
    ],
)
def test_a_changed_certificate_or_key_cuts_the_certificate_tunnels_only(
    was: dict[str, str], now: dict[str, str], expected: tuple[str, ...]
) -> None:
    rw = pubkey("rw")
    w = want(A, rw, secrets=(psk("a"),), tls=True)
    before = loaded(w, {"psk-a": "v1"}, was)
    assert cuts(before, w, {"psk-a": "v1"}, now) == ((Cut("rw", expected),) if expected else ())


CA2 = IkeCertificate("ca2", SecretRef("other-tls", "ca.crt"), ca=True)


def test_a_ca_cuts_only_the_tunnels_pinned_to_it_and_our_own_key_every_certificate_tunnel() -> None:
    rw, rw2 = pubkey("rw"), pubkey("rw2", "ca2")
    ipsec = Ipsec(
        tunnels=(A, rw, rw2), secrets=(psk("a"),), certificates=(CA, CA2, CERT), private_keys=(KEY,)
    )
    w = desired(Plan(gateway=GW, type="ipsec", ipsec=ipsec))
    creds = {**CREDS, "cert/ca2": "o1"}
    before = loaded(w, {"psk-a": "v1"}, creds)

    def plan(**changes: Any) -> Desired:
        return desired(Plan(gateway=GW, type="ipsec", ipsec=dataclasses.replace(ipsec, **changes)))

    # ca renewed in its Secret: rw (pinned to it) only; rw2 authenticated through ca2.
    assert cuts(before, w, {"psk-a": "v1"}, {**creds, "cert/ca": "c2"}) == (Cut("rw", ("remote", "cert/ca")),)
    # ca leaves the plan, rw moves to ca2: rw only.
    moved = plan(tunnels=(A, pubkey("rw", "ca2"), rw2), certificates=(CA2, CERT))
    assert cuts(before, moved, {"psk-a": "v1"}, creds) == (Cut("rw", ("remote", "removed:cert/ca")),)
    # Our own key dropped (a new id) or renewed: every certificate tunnel, never the PSK one.
    keyless = plan(private_keys=())
    assert cuts(before, keyless, {"psk-a": "v1"}, creds) == (
        Cut("rw", ("removed:key/gateway",)),
        Cut("rw2", ("removed:key/gateway",)),
    )
    # A CA nobody is pinned to vouched for nobody: its renewal cuts nothing.
    unpinned = plan(tunnels=(A, rw))
    idle = loaded(unpinned, {"psk-a": "v1"}, creds)
    assert cuts(idle, unpinned, {"psk-a": "v1"}, {**creds, "cert/ca2": "o2"}) == ()
