"""What a pod sends out of its eth0, recorded on the node end of its veth (a packet socket, as tcpdump on the
node would), summarised as connections: who opened them (the pod: egress; the node or another pod:
ingress, e.g. the kubelet's probes), protocol, the far end's address and port.

The capture starts before the pod's first container and ends with the sandbox, so nothing the pod sends
through eth0 escapes it. NIC2 and the tunnels are other interfaces and are not seen here (NetworkPolicy
does not reach them either). IPv6 link-local chatter (router solicitations, MLD) and ARP never leave the
segment; they are counted apart.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from lab.kubelet.nsnet import socket_in

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
PROTOCOLS = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}


@dataclass(frozen=True, order=True)
class Flow:
    """One connection's far end as the pod sees it: ``direction`` is ``egress`` when the pod opened it."""

    direction: str
    protocol: str
    peer: str
    port: int | None


@dataclass
class FlowStats:
    packets: int = 0
    first: float = 0.0
    connections: int = 0


@dataclass(frozen=True)
class Packet:
    protocol: str
    src: str
    dst: str
    sport: int | None
    dport: int | None
    syn: bool = False
    ack: bool = False


def parse(frame: bytes) -> Packet | str | None:
    """An Ethernet frame carrying IPv4 as a ``Packet``; other ethertypes by name (pure)."""
    if len(frame) < 14:
        return None
    (ethertype,) = struct.unpack("!H", frame[12:14])
    if ethertype == 0x0806:
        return "ARP"
    if ethertype == 0x86DD:
        return "IPv6 link-local" if len(frame) >= 54 and frame[38] in (0xFE, 0xFF) else "IPv6"
    if ethertype != 0x0800 or len(frame) < 34:
        return f"ethertype {ethertype:#06x}"
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    proto = ip[9]
    src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
    sport = dport = None
    syn = ack = False
    if proto in (6, 17, 132) and len(ip) >= ihl + 4:
        sport, dport = struct.unpack("!HH", ip[ihl : ihl + 4])
        if proto == 6 and len(ip) >= ihl + 14:
            flags = ip[ihl + 13]
            syn, ack = bool(flags & 0x02), bool(flags & 0x10)
    return Packet(PROTOCOLS.get(proto, str(proto)), src, dst, sport, dport, syn, ack)


@dataclass
class Tracker:
    """Connections by 5-tuple, with who spoke first (pure state, fed packets in order)."""

    opened_by_pod: dict[tuple[str, str, int | None, str, int | None], bool] = field(default_factory=dict)
    flows: dict[Flow, FlowStats] = field(default_factory=dict)

    def feed(self, pkt: Packet, from_pod: bool, at: float) -> None:
        if from_pod:
            key = (pkt.protocol, pkt.src, pkt.sport, pkt.dst, pkt.dport)
        else:
            key = (pkt.protocol, pkt.dst, pkt.dport, pkt.src, pkt.sport)
        new = key not in self.opened_by_pod
        if new:
            # The pod opened it when its packet came first (for TCP: a bare SYN, not a SYN-ACK).
            self.opened_by_pod[key] = from_pod and not (pkt.protocol == "TCP" and pkt.ack)
        by_pod = self.opened_by_pod[key]
        _, _, pod_port, peer, peer_port = key
        flow = Flow("egress" if by_pod else "ingress", pkt.protocol, peer, peer_port if by_pod else pod_port)
        st = self.flows.setdefault(flow, FlowStats(first=at))
        st.packets += 1
        st.connections += int(new)


class EgressCapture:
    """Records the frames crossing ``interface`` of namespace ``ns`` (the node end of a pod's veth)."""

    def __init__(self, ns: str, interface: str) -> None:
        self.ns = ns
        self.interface = interface
        self.tracker = Tracker()
        self.other: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sock = socket_in(ns, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._sock.bind((interface, 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"capture-{interface}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame, addr = self._sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            from_pod = addr[2] != PACKET_OUTGOING  # the node sending to the pod is "outgoing" here
            got = parse(frame)
            with self._lock:
                if isinstance(got, Packet):
                    self.tracker.feed(got, from_pod, time.time())
                elif got is not None and from_pod:
                    self.other[got] = self.other.get(got, 0) + 1

    def snapshot(self) -> dict[Flow, FlowStats]:
        with self._lock:
            return {k: FlowStats(v.packets, v.first, v.connections) for k, v in self.tracker.flows.items()}

    def egress(self) -> dict[Flow, FlowStats]:
        return {k: v for k, v in self.snapshot().items() if k.direction == "egress"}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
