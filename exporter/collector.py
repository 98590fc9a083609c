"""The metrics: a pure function from one scrape's ``Snapshot`` to Prometheus metric families.

Conventions (what the exporters people run today get wrong, issue 7):
* traffic is a counter (``_total``) that stays monotonic across CHILD_SA rekeys (``ipsec.py``);
* points in time are unix timestamps (``_timestamp_seconds``), not ages;
* every label value is stable over a tunnel's life: unique ids, algorithms and traffic selectors live
  only on ``_info`` series, whose value is always 1;
* ``*_up`` says whether the daemon answered this scrape, and is in every scrape of a watched daemon;
  configured-but-down tunnels are rows with 0;
* no secret: a ``PeerState``'s preshared key and a device's private key are never read here.

``SnapshotCollector`` adapts this to prometheus_client's Collector protocol; tests register it in a fresh
``CollectorRegistry`` and read values with ``get_sample_value``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import ne
from typing import Protocol

from prometheus_client.core import Metric

from exporter.family import Family
from exporter.ipsec import CHILD_INFO_LABELS, IKE_INFO_LABELS, IpsecView
from exporter.wireguard import InterfaceView


class DaemonFacts(Protocol):
    """What the metrics read of ``gwkit.vici.queries.DaemonInfo`` (a Protocol, so this pure module does
    not import the VICI client)."""

    @property
    def daemon(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def sysname(self) -> str: ...
    @property
    def release(self) -> str: ...
    @property
    def started(self) -> float | None: ...
    @property
    def ikesas_total(self) -> int: ...
    @property
    def ikesas_half_open(self) -> int: ...
    @property
    def workers_total(self) -> int: ...
    @property
    def workers_idle(self) -> int: ...
    @property
    def queued_jobs(self) -> int: ...
    @property
    def scheduled_jobs(self) -> int: ...


@dataclass(frozen=True)
class StrongswanSnapshot:
    up: bool
    duration: float
    view: IpsecView = field(default_factory=IpsecView)
    info: DaemonFacts | None = None
    counters: Mapping[str, int] | None = None


@dataclass(frozen=True)
class WireGuardSnapshot:
    duration: float
    interfaces: tuple[InterfaceView, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    strongswan: StrongswanSnapshot | None = None
    """None when the exporter watches no charon (no --vici-socket)."""
    wireguard: WireGuardSnapshot | None = None
    """None when the exporter watches no WireGuard interface."""
    plan_valid: bool | None = None
    """Whether the ``--plan`` file is valid now; None without ``--plan``."""
    ha_standby: bool | None = None
    """Whether the agent's role file says this pod is the HA standby; None when there is no role file to
    read (no ``--plan``, no ``--ha-role``)."""


# get-counters keys -> (metric, labels). Message counters: <exchange>-<in|out>-<req|resp>.
_EXCHANGES = {
    "ike-init": "ike_sa_init",
    "ike-auth": "ike_auth",
    "create-child": "create_child_sa",
    "info": "informational",
}


def _counter_families(counters: Mapping[str, int]) -> Iterator[Family]:
    rekeys = Family.counter(
        "strongswan_ike_rekeys_total", "IKE_SA rekeys charon performed, by its role.", labels=["role"]
    )
    child = Family.counter("strongswan_child_rekeys_total", "CHILD_SA rekeys charon performed.")
    invalid = Family.counter(
        "strongswan_invalid_messages_total",
        "IKE messages charon dropped (invalid: failed to parse or verify; invalid_spi: unknown SPI).",
        labels=["reason"],
    )
    messages = Family.counter(
        "strongswan_messages_total",
        "IKE messages by exchange, direction and kind (get-counters).",
        labels=["exchange", "direction", "kind"],
    )
    for key, value in sorted(counters.items()):
        if key == "ike-rekey-init":
            rekeys.add_metric(["initiator"], value)
        elif key == "ike-rekey-resp":
            rekeys.add_metric(["responder"], value)
        elif key == "child-rekey":
            child.add_metric([], value)
        elif key in ("invalid", "invalid-spi"):
            invalid.add_metric([key.replace("-", "_")], value)
        else:
            head, _, kind = key.rpartition("-")
            exchange, _, direction = head.rpartition("-")
            if exchange in _EXCHANGES and direction in ("in", "out") and kind in ("req", "resp"):
                messages.add_metric(
                    [_EXCHANGES[exchange], direction, "request" if kind == "req" else "response"], value
                )
    yield from (rekeys, child, invalid, messages)


def _info(name: str, doc: str, labels: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> Family:
    fam = Family.info(name, doc, labels=labels)
    rows = list(rows)
    fam.extend(rows, [1] * len(rows))
    return fam


def strongswan_families(s: StrongswanSnapshot) -> Iterator[Family]:
    yield Family.gauge("strongswan_up", "1 if charon answered this scrape over VICI.", value=float(s.up))
    yield Family.gauge(
        "strongswan_scrape_duration_seconds", "Time this scrape spent querying charon.", value=s.duration
    )
    if s.info is not None:
        i = s.info
        yield Family.info(
            "strongswan",
            "The charon daemon answering on the VICI socket.",
            value={"daemon": i.daemon, "version": i.version, "sysname": i.sysname, "release": i.release},
        )
        if i.started is not None:
            yield Family.gauge(
                "strongswan_start_time_seconds",
                "Unix time charon started (changes on a restart; second precision).",
                value=i.started,
            )
        yield Family.gauge("strongswan_ike_sas", "IKE_SAs charon holds (stats).", value=i.ikesas_total)
        yield Family.gauge(
            "strongswan_ike_sas_half_open", "Half-open IKE_SAs (stats).", value=i.ikesas_half_open
        )
        yield Family.gauge("strongswan_workers", "charon worker threads.", value=i.workers_total)
        yield Family.gauge("strongswan_workers_idle", "Idle charon worker threads.", value=i.workers_idle)
        yield Family.gauge("strongswan_jobs_queued", "Jobs waiting in charon's queues.", value=i.queued_jobs)
        yield Family.gauge("strongswan_jobs_scheduled", "Jobs scheduled for later.", value=i.scheduled_jobs)
    if s.counters is not None:
        yield from _counter_families(s.counters)

    v = s.view
    up = Family.gauge(
        "strongswan_tunnel_up",
        "1 if the tunnel has an ESTABLISHED IKE_SA with at least one INSTALLED CHILD_SA; 0 if configured "
        "(or seen before) but down.",
        labels=["tunnel"],
    )
    ikes = Family.gauge("strongswan_tunnel_ike_sas", "ESTABLISHED IKE_SAs of the tunnel.", labels=["tunnel"])
    installed = Family.gauge(
        "strongswan_tunnel_children_installed",
        "Child configs of the tunnel with an INSTALLED CHILD_SA.",
        labels=["tunnel"],
    )
    configured = Family.gauge(
        "strongswan_tunnel_children_configured", "Child configs the plan gives the tunnel.", labels=["tunnel"]
    )
    nbytes = Family.counter(
        "strongswan_tunnel_bytes_total",
        "ESP payload bytes through the tunnel, monotonic across CHILD_SA rekeys.",
        labels=["tunnel", "direction"],
    )
    npackets = Family.counter(
        "strongswan_tunnel_packets_total",
        "ESP packets through the tunnel, monotonic across CHILD_SA rekeys.",
        labels=["tunnel", "direction"],
    )
    established = Family.gauge(
        "strongswan_tunnel_established_timestamp_seconds",
        "Unix time the tunnel's newest IKE_SA was established.",
        labels=["tunnel"],
    )
    rekey = Family.gauge(
        "strongswan_tunnel_rekey_timestamp_seconds",
        "Unix time of the tunnel's next scheduled CHILD_SA rekey (earliest over its CHILD_SAs); a value in "
        "the past means a rekey is overdue.",
        labels=["tunnel"],
    )
    for t in v.tunnels:
        up.add_metric([t.name], float(t.up))
        ikes.add_metric([t.name], t.ike_sas)
        installed.add_metric([t.name], t.children_installed)
        if t.configured:
            configured.add_metric([t.name], t.children_configured)
        nbytes.add_metric([t.name, "in"], t.counts.bytes_in)
        nbytes.add_metric([t.name, "out"], t.counts.bytes_out)
        npackets.add_metric([t.name, "in"], t.counts.packets_in)
        npackets.add_metric([t.name, "out"], t.counts.packets_out)
        if t.established is not None:
            established.add_metric([t.name], t.established)
        if t.next_rekey is not None:
            rekey.add_metric([t.name], t.next_rekey)
    yield from (up, ikes, installed, configured, nbytes, npackets, established, rekey)

    child_up = Family.gauge(
        "strongswan_child_up",
        "1 if the child config (one remote subnet) has an INSTALLED CHILD_SA.",
        labels=["tunnel", "child", "subnet"],
    )
    child_bytes = Family.counter(
        "strongswan_child_bytes_total",
        "ESP payload bytes per child config, monotonic across rekeys.",
        labels=["tunnel", "child", "subnet", "direction"],
    )
    for c in v.children:
        child_up.add_metric([c.tunnel, c.child, c.subnet], float(c.up))
        child_bytes.add_metric([c.tunnel, c.child, c.subnet, "in"], c.counts.bytes_in)
        child_bytes.add_metric([c.tunnel, c.child, c.subnet, "out"], c.counts.bytes_out)
    yield from (child_up, child_bytes)
    yield from (
        _info(
            "strongswan_ike_sa",
            "One series per IKE_SA: unique id, identities, algorithms.",
            IKE_INFO_LABELS,
            (i.values for i in v.ike_info),
        ),
        _info(
            "strongswan_child_sa",
            "One series per CHILD_SA: unique id, reqid, algorithms, traffic selectors.",
            CHILD_INFO_LABELS,
            (i.values for i in v.child_info),
        ),
    )


def wireguard_families(w: WireGuardSnapshot) -> Iterator[Family]:
    yield Family.gauge(
        "wireguard_scrape_duration_seconds", "Time this scrape spent querying WireGuard.", value=w.duration
    )
    up = Family.gauge("wireguard_up", "1 if the interface answered this scrape.", labels=["interface"])
    info = Family.info("wireguard_interface", "How the interface is read.", labels=["interface", "backend"])
    count = Family.gauge("wireguard_peers", "Peers configured on the interface.", labels=["interface"])
    present = Family.gauge(
        "wireguard_peer_present",
        "For peers the plan configures: 1 if the interface has the peer.",
        labels=["interface", "peer"],
    )
    rx = Family.counter(
        "wireguard_peer_receive_bytes_total", "Bytes received from the peer.", labels=["interface", "peer"]
    )
    tx = Family.counter(
        "wireguard_peer_transmit_bytes_total", "Bytes sent to the peer.", labels=["interface", "peer"]
    )
    hs = Family.gauge(
        "wireguard_peer_last_handshake_timestamp_seconds",
        "Unix time of the peer's latest handshake; absent if it never completed one.",
        labels=["interface", "peer"],
    )
    pinfo = Family.info(
        "wireguard_peer",
        "The peer's public key and current endpoint.",
        labels=["interface", "peer", "public_key", "endpoint"],
    )
    for i in w.interfaces:
        iface = i.interface
        up.add_metric([iface], float(i.up))
        if i.backend:
            info.add_metric([iface, i.backend], {})
        present.extend([(iface, n) for n in i.missing], [0] * len(i.missing))
        if not i.up:
            continue
        p = i.peers
        count.add_metric([iface], len(p))
        # Columns zipped and filtered at C level: at 10,000 peers a Python loop per sample was a large
        # part of a scrape.
        labels = list(zip(repeat(iface), p.peer))
        named = list(compress(labels, map(ne, p.peer, p.public_key)))
        present.extend(named, repeat(1, len(named)))
        rx.extend(labels, p.rx_bytes)
        tx.extend(labels, p.tx_bytes)
        hs.extend(map(labels.__getitem__, p.handshakes), p.last_handshake)
        pinfo.extend(zip(repeat(iface), p.peer, p.public_key, p.endpoint), repeat(1, len(p)))
    yield from (up, info, count, present, rx, tx, hs, pinfo)


def families(snapshot: Snapshot) -> Iterator[Family]:
    if snapshot.plan_valid is not None:
        yield Family.gauge(
            "vpngw_exporter_plan_valid",
            "1 if the --plan file is valid now; 0 while it is missing or invalid (tunnels and peers are then "
            "named by the last good plan, and before the first one only what the command line names is "
            "watched).",
            value=float(snapshot.plan_valid),
        )
    if snapshot.ha_standby is not None:
        yield Family.gauge(
            "vpngw_ha_standby",
            "1 while the agent's role file says this pod is its gateway's warm standby (HA: it does not "
            "serve, its tunnels and peers are down by design and its tunnel alerts are silenced); 0 when "
            "it serves: active, no HA, no role file, or one that says neither.",
            value=float(snapshot.ha_standby),
        )
    if snapshot.strongswan is not None:
        yield from strongswan_families(snapshot.strongswan)
    if snapshot.wireguard is not None:
        yield from wireguard_families(snapshot.wireguard)


class SnapshotCollector:
    """prometheus_client Collector over a snapshot provider (``Collector`` protocol: ``collect``)."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return (f.to_metric() for f in families(self._snapshot()) if f.keys)

    def describe(self) -> list[Metric]:
        return []  # no fixed names to pre-register: families vary with what the daemons report
