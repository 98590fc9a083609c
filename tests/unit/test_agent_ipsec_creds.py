"""Certificates and private keys in the IPsec agent's pure plan diff."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.ipsec.plan import (
    Desired,
    Loaded,
    PlanRejected,
    SecretState,
    compared_conn,
    conn_digest,
    desired,
    diff,
    with_cacerts,
)
from gwplan import Child, GatewayRef, IkeCertificate, IkePrivateKey, IkeSecret, Ipsec, Plan, SecretRef, Tunnel

GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "ns", "gw")
TLS = "gw-tls"


def plan(*, certs: tuple[IkeCertificate, ...] = (), keys: tuple[IkePrivateKey, ...] = ()) -> Plan:
    return Plan(gateway=GW, type="ipsec", ipsec=Ipsec(certificates=certs, private_keys=keys))


CERT = IkeCertificate("gateway", SecretRef(TLS, "tls.crt"))
CA = IkeCertificate("ca", SecretRef(TLS, "ca.crt"), ca=True)
KEY = IkePrivateKey("gateway", SecretRef(TLS, "tls.key"))


def test_certificate_and_key_of_the_same_id_do_not_collide() -> None:
    want = desired(plan(certs=(CERT, CA), keys=(KEY,)))
    assert set(want.creds) == {"cert/gateway", "cert/ca", "key/gateway"}


def test_a_duplicate_certificate_id_names_the_field() -> None:
    with pytest.raises(PlanRejected, match=r"ipsec.certificates\[1\].id: 'gateway' is used twice"):
        desired(plan(certs=(CERT, CERT)))


@pytest.mark.parametrize(
    ("loaded", "versions", "expected"),
    [
        pytest.param(
            {}, {"cert/gateway": "v1", "key/gateway": "v1"}, ("cert/gateway", "key/gateway"), id="fresh"
        ),
        pytest.param(
            {"cert/gateway": "v1", "key/gateway": "v1"},
            {"cert/gateway": "v1", "key/gateway": "v1"},
            (),
            id="unchanged",
        ),
        pytest.param(
            {"cert/gateway": "v1", "key/gateway": "v1"},
            {"cert/gateway": "v2", "key/gateway": "v2"},
            ("cert/gateway", "key/gateway"),
            id="renewed",
        ),
        pytest.param({}, {"key/gateway": "v1"}, ("key/gateway",), id="unreadable-cert-left-alone"),
    ],
)
def test_creds_load_when_their_secret_version_changes(
    loaded: dict[str, str], versions: dict[str, str], expected: tuple[str, ...]
) -> None:
    want = desired(plan(certs=(CERT,), keys=(KEY,)))
    changes = diff(Loaded(creds=loaded), want, {}, versions)
    assert changes.load_creds == expected
    assert changes.empty is (not expected)


# --- trust pinned per connection ------------------------------------------------------------------------

PSK_REF = SecretRef("tenant-psk", "psk")


def conn(name: str, auth: str = "pubkey", **extra: Any) -> dict[str, Any]:
    return {name: {
        "version": "2", "remote_addrs": ["%any"],
        "local": {"auth": auth, "id": "gw.example"},
        "remote": {"auth": auth, "id": f"{name}.example", **extra},
        "children": {f"{name}-0": {"local_ts": ["198.18.0.0/24"], "remote_ts": ["10.1.0.0/24"]}},
    }}  # fmt: skip


def rw(name: str, *cas: str, auth: str = "pubkey", **extra: Any) -> Tunnel:
    return Tunnel(name, False, (Child(f"{name}-0", "10.1.0.0/24"),), conn(name, auth, **extra), cas or None)


CA2 = IkeCertificate("ca2", SecretRef("other", "ca.crt"), ca=True)


def tunnels_plan(*tunnels: Tunnel, secrets: tuple[IkeSecret, ...] = ()) -> Plan:
    ipsec = Ipsec(secrets=secrets, tunnels=tunnels, certificates=(CERT, CA, CA2), private_keys=(KEY,))
    return Plan(gateway=GW, type="ipsec", ipsec=ipsec)


def test_each_certificate_tunnel_is_pinned_to_the_cas_it_names() -> None:
    want = desired(tunnels_plan(rw("a", "ca"), rw("b", "ca2", "ca"), rw("p", auth="psk")))
    assert want.pins == {"a": ("cert/ca",), "b": ("cert/ca2", "cert/ca")}


@pytest.mark.parametrize(
    ("tunnel", "message"),
    [
        pytest.param(rw("a"), r"tunnels\[0\]\.peerCas: conn 'a' authenticates its peer by certificate but "
                     "names no CA", id="certificate-peer-without-ca"),
        pytest.param(rw("a", "gateway"), r"peerCas\[0\]: 'gateway' is not a CA", id="our-own-certificate"),
        pytest.param(rw("a", "ca", "nope"), r"peerCas\[1\]: 'nope' is not a CA", id="unknown-id"),
        pytest.param(rw("a", "ca", auth="psk"), r"peerCas: conn 'a' authenticates its peer by PSK",
                     id="psk-peer-naming-a-ca"),
        pytest.param(rw("a", "ca", cacerts=["x"]), r"conn\.a\.remote\.cacerts: the agent sets it",
                     id="cacerts-in-the-plan"),
        pytest.param(Tunnel("a", False, (), {"a": {"remote": {"id": "a.example"}}}),
                     "names no CA", id="default-auth-is-pubkey"),
    ],
)  # fmt: skip
def test_a_tunnel_whose_trust_is_not_pinned_is_refused(tunnel: Tunnel, message: str) -> None:
    with pytest.raises(PlanRejected, match=message):
        desired(tunnels_plan(tunnel))


def test_cacerts_go_into_the_certificate_remote_rounds_only() -> None:
    body = {"a": {**conn("a")["a"], "remote-2": {"auth": "psk"}, "remote-3": {"id": "x"}}}
    out = with_cacerts(body, ["PEM1", "PEM2"])
    assert out["a"]["remote"]["cacerts"] == ["PEM1", "PEM2"]
    assert out["a"]["remote-3"]["cacerts"] == ["PEM1", "PEM2"]  # charon's default auth is pubkey
    assert "cacerts" not in out["a"]["remote-2"] and "cacerts" not in out["a"]["local"]
    assert "cacerts" not in body["a"]["remote"], "the plan's payload is not changed"


def test_the_compared_conn_names_each_pinned_ca_by_version_and_none_when_one_is_unreadable() -> None:
    want = desired(tunnels_plan(rw("a", "ca"), rw("p", auth="psk")))
    compared = compared_conn(want, "a", {"cert/ca": "v7"})
    assert compared is not None and compared["a"]["remote"]["cacerts"] == ["cert/ca@v7"]
    assert compared_conn(want, "a", {}) is None
    assert compared_conn(want, "p", {}) == want.conns["p"]


V = {"cert/gateway": "g1", "cert/ca": "c1", "cert/ca2": "d1", "key/gateway": "k1"}


def applied(want: Desired, cv: dict[str, str], versions: dict[str, str]) -> Loaded:
    """What the keeper records after loading ``want`` with these versions."""
    compared = {n: compared_conn(want, n, cv) for n in want.conns}
    return Loaded(
        conns={n: conn_digest(c) for n, c in compared.items() if c is not None},
        secrets={sid: SecretState(s.owners, versions[sid], s.ref) for sid, s in want.secrets.items()},
        creds=dict(cv),
        bodies={n: c[n] for n, c in compared.items() if c is not None},
    )


@pytest.mark.parametrize(
    ("now", "unknown", "clear", "conns"),
    [
        pytest.param(V, False, (), (), id="unchanged"),
        pytest.param({**V, "cert/ca": "c2"}, False, ("cert/ca",), ("a",), id="ca-renewed"),
        pytest.param({**V, "key/gateway": "k2"}, False, ("key/gateway",), (), id="our-key-renewed"),
        pytest.param({k: v for k, v in V.items() if k != "cert/ca"}, False, (), (), id="unreadable-ca-kept"),
        pytest.param(V, True, ("unknown",), (), id="charon-filled-by-someone-else"),
    ],
)
def test_a_replaced_credential_clears_them_all_and_loads_everything_again(
    now: dict[str, str], unknown: bool, clear: tuple[str, ...], conns: tuple[str, ...]
) -> None:
    secrets = (IkeSecret("psk-p", ("p.example",), PSK_REF), IkeSecret("psk-q", ("q.example",), PSK_REF))
    want = desired(tunnels_plan(rw("a", "ca"), rw("b", "ca2"), rw("p", auth="psk"), secrets=secrets))
    loaded = dataclasses.replace(applied(want, V, {"psk-p": "p1", "psk-q": "q1"}), creds_unknown=unknown)
    changes = diff(loaded, want, {"psk-p": "p1"}, now)  # psk-q unreadable now
    assert changes.clear_creds == clear
    assert changes.load_conns == conns
    if clear:
        assert changes.load_creds == tuple(sorted(now)), "everything the plan has, changed or not"
        assert changes.load_secrets == ("psk-p",), "every readable shared key: clear-creds drops them too"
    else:
        assert changes.load_creds == () and changes.load_secrets == ()


def test_a_credential_dropped_from_the_plan_clears_and_one_added_does_not() -> None:
    want = desired(tunnels_plan(rw("a", "ca")))
    before = applied(want, V, {})
    dropped = desired(Plan(gateway=GW, type="ipsec", ipsec=Ipsec(
        tunnels=(rw("a", "ca"),), certificates=(CERT, CA), private_keys=(KEY,))))  # fmt: skip
    changes = diff(before, dropped, {}, V)
    assert changes.clear_creds == ("cert/ca2",)
    assert changes.load_creds == ("cert/ca", "cert/gateway", "key/gateway")
    added = applied(dropped, {k: v for k, v in V.items() if k != "cert/ca2"}, {})
    changes = diff(added, want, {}, V)
    assert changes.clear_creds == () and changes.load_creds == ("cert/ca2",)
