"""The lab's L3 agent: makes what the real Neutron records about one router real in a router namespace.

It joins the two labs (so it sits beside them, not in ``lab.openstack``, which stands alone): Neutron's
API through ``lab.openstack.rest``, the datapath through ``lab.netns``.

Neutron runs without agents (docs/openstack-lab.md): a floating IP or an extra route it records reaches no
datapath. ``L3Follower`` polls Neutron's API (the source of truth; through a ``FaultProxy`` if given its
URL) and programs a router namespace to match:

* every floating IP associated through ``router_id``: DNAT ``floating_ip_address`` -> ``fixed_ip_address``
  (PREROUTING and OUTPUT) and SNAT back for what the fixed address sends (POSTROUTING; only out of
  ``external_dev`` when given, as the L3 agent SNATs only what leaves through the router's gateway port).
  The rules live in the follower's own nat chains (``L3F-PRE``, ``L3F-OUT``, ``L3F-POST``), rewritten as
  a whole in one ``iptables-restore --noflush`` transaction (a listed chain is flushed and refilled);
* the router's extra routes: ``ip route replace <destination> via <nexthop> proto 113``; routes of
  protocol 113 that Neutron no longer holds are deleted (the protocol marks the follower's own routes,
  also those a previous follower left).

Where the fixed addresses live is the lab's business: they and the nexthops must be routable from the
router namespace. Not read: ports' ``allowed_address_pairs``. They only permit traffic through port
security, which the L2 agent's firewall enforces, not the L3 agent; the lab filters nothing, so they
would change nothing here. Not modelled: security groups, port security, the default SNAT of ports
without a floating IP, the floating IP's address on the gateway device (callers route the floating
range to the router), HA routers.

Conntrack as the legacy L3 agent leaves it (neutron 29.0.0, ``RouterInfo.process_floating_ip_addresses``):
a floating IP that goes (disassociated, deleted) has its conntrack entries deleted (``conntrack -D -d``
and ``-q``); a floating IP that MOVES to another fixed IP in one update keeps them (``move_floating_ip``
does nothing for a legacy router), so a flow that was running keeps its DNAT to the old port until its
entry expires (docs/openstack-lab.md has what that means, measured).

A Neutron that does not answer changes nothing: the datapath keeps the last state applied, the error is
counted, and the next poll that succeeds catches up.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from lab import netns
from lab.openstack.rest import RestError, call

log = logging.getLogger(__name__)

ROUTE_PROTO = "113"
"""The routing protocol that marks the follower's routes (iproute2 names none; 186 would read "bgp")."""
CHAINS = (("PREROUTING", "L3F-PRE"), ("OUTPUT", "L3F-OUT"), ("POSTROUTING", "L3F-POST"))


@dataclass(frozen=True)
class Desired:
    """What Neutron holds for the router, in a canonical order (two equal states compare equal)."""

    nat: tuple[tuple[str, str], ...] = ()
    """(floating IP, fixed IP) of every associated floating IP."""
    routes: tuple[tuple[str, str], ...] = ()
    """(destination CIDR, nexthop) of every extra route."""


def _cidr(dst: str) -> str:
    return "0.0.0.0/0" if dst == "default" else str(ipaddress.ip_network(dst, strict=False))


def read_neutron(endpoint: str, router_id: str, timeout: float = 5.0) -> Desired:
    """One reading of Neutron (two GETs, only the fields used); ``RestError`` when it does not answer."""
    fields = "&".join(f"fields={f}" for f in ("floating_ip_address", "fixed_ip_address", "port_id"))
    fips = call(endpoint, "GET", f"/v2.0/floatingips?router_id={router_id}&{fields}", timeout=timeout)
    router = call(endpoint, "GET", f"/v2.0/routers/{router_id}?fields=routes", timeout=timeout)["router"]
    return Desired(
        nat=tuple(
            sorted(
                (f["floating_ip_address"], f["fixed_ip_address"])
                for f in fips["floatingips"]
                if f.get("port_id") and f.get("fixed_ip_address")
            )
        ),
        routes=tuple(sorted((_cidr(r["destination"]), r["nexthop"]) for r in router.get("routes") or [])),
    )


def nat_rules(nat: tuple[tuple[str, str], ...], external_dev: str | None) -> str:
    """The ``iptables-restore --noflush`` input that makes the follower's chains hold ``nat``."""
    lines = ["*nat"] + [f":{chain} - [0:0]" for _, chain in CHAINS]
    out = f" -o {external_dev}" if external_dev else ""
    for fip, fixed in nat:
        lines.append(f"-A L3F-PRE -d {fip}/32 -j DNAT --to-destination {fixed}")
        lines.append(f"-A L3F-OUT -d {fip}/32 -j DNAT --to-destination {fixed}")
        lines.append(f"-A L3F-POST -s {fixed}/32{out} -j SNAT --to-source {fip}")
    return "\n".join([*lines, "COMMIT", ""])


def dnat_fips(ns: str) -> set[str]:
    """The floating IPs ``ns``'s ``L3F-PRE`` chain DNATs now (also a previous follower's)."""
    save = netns.run(netns.ns_exec(ns, "iptables-save", "-t", "nat")).stdout.decode()
    return {
        line.split()[3].removesuffix("/32") for line in save.splitlines() if line.startswith("-A L3F-PRE -d ")
    }


def own_routes(ns: str) -> set[tuple[str, str]]:
    """(destination, nexthop) of the routes of the follower's protocol in ``ns``."""
    out = netns.run(["ip", "-n", ns, "-j", "route", "show", "proto", ROUTE_PROTO]).stdout
    return {(_cidr(r["dst"]), r.get("gateway", "")) for r in json.loads(out or b"[]")}


@dataclass
class Stats:
    """What the follower did, for tests and the docs' numbers."""

    polls: int = 0
    ok: int = 0
    """Polls Neutron answered."""
    errors: int = 0
    applies: int = 0
    last_error: str = ""
    applied: Desired | None = None
    applied_at: float = 0.0
    """``time.monotonic()`` when the datapath last changed."""
    history: list[tuple[float, Desired]] = field(default_factory=list)
    """(``time.monotonic()``, state) of every change applied."""


class L3Follower:
    """Polls Neutron at ``endpoint`` every ``interval`` s for ``router_id`` and programs namespace ``ns``.

    ``start()`` runs it in a daemon thread (``close()`` stops it and, with ``clean=True``, removes its
    chains and routes); ``sync()`` is one poll-and-apply, for callers that drive it themselves."""

    def __init__(
        self,
        endpoint: str,
        router_id: str,
        ns: str,
        *,
        external_dev: str | None = None,
        interval: float = 0.2,
        timeout: float = 5.0,
    ) -> None:
        self.endpoint, self.router_id, self.ns = endpoint.rstrip("/"), router_id, ns
        self.external_dev, self.interval, self.timeout = external_dev, interval, timeout
        self.stats = Stats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._hooked = False

    # --- the datapath -------------------------------------------------------------------------------

    def _hook(self) -> None:
        """The jumps from the built-in chains to the follower's (once; ``-C`` first keeps it idempotent)."""
        restore = "\n".join(["*nat"] + [f":{c} - [0:0]" for _, c in CHAINS] + ["COMMIT", ""])
        netns.run(netns.ns_exec(self.ns, "iptables-restore", "--noflush"), input=restore.encode())
        for builtin, chain in CHAINS:
            if self._nat("-C", builtin, "-j", chain, check=False).returncode:
                self._nat("-I", builtin, "-j", chain)
        self._hooked = True

    def _nat(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return netns.run(netns.ns_exec(self.ns, "iptables", "-t", "nat", *args), check=check)

    def _forget_flows(self, fip: str) -> None:
        """What the L3 agent does for a floating IP it removes (``delete_conntrack_state``): the conntrack
        entries to it (``-d``, flows from outside) and to it in reply (``-q``, the port's SNATed flows)
        go, so their next packet meets the rules of now. ``conntrack`` exits 1 when none matched."""
        for flag in ("-d", "-q"):
            netns.run(netns.ns_exec(self.ns, "conntrack", "-D", flag, fip), check=False)

    def _route(self, verb: str, dst: str, via: str) -> subprocess.CompletedProcess[bytes]:
        return netns.run(
            ["ip", "-n", self.ns, "route", verb, dst, "via", via, "proto", ROUTE_PROTO], check=False
        )

    def apply(self, want: Desired) -> None:
        """Make the namespace hold ``want``: the nat chains in one transaction, then the routes' diff.
        Raises ``netns.LabError`` when a command fails (a nexthop not routable from the namespace)."""
        gone = dnat_fips(self.ns) - {fip for fip, _ in want.nat}
        if not self._hooked:
            self._hook()
        rules = nat_rules(want.nat, self.external_dev)
        netns.run(netns.ns_exec(self.ns, "iptables-restore", "--noflush"), input=rules.encode())
        for fip in sorted(gone):
            self._forget_flows(fip)
        have = own_routes(self.ns)
        for dst, via in sorted(have - set(want.routes)):
            self._route("del", dst, via)
        failed = []
        for dst, via in want.routes:
            res = self._route("replace", dst, via)
            if res.returncode:
                failed.append(f"{dst} via {via}: {res.stderr.decode(errors='replace').strip()}")
        if failed:
            raise netns.LabError("routes not installed: " + "; ".join(failed))

    # --- the loop -----------------------------------------------------------------------------------

    def sync(self) -> bool:
        """One poll; applies when Neutron's state differs from the last applied. Whether it changed the
        datapath. Neutron's errors and failed commands are counted, never raised (the next poll retries)."""
        with self._lock:
            self.stats.polls += 1
            try:
                want = read_neutron(self.endpoint, self.router_id, self.timeout)
            except (RestError, KeyError, TypeError, ValueError) as exc:
                self._failed(f"neutron: {exc}")
                return False
            self.stats.ok += 1
            if want == self.stats.applied:
                return False
            try:
                self.apply(want)
            except netns.LabError as exc:
                self._failed(f"datapath: {exc}")
                return False
            now = time.monotonic()
            self.stats.applies += 1
            self.stats.applied, self.stats.applied_at = want, now
            self.stats.history.append((now, want))
            log.info("l3follower.applied ns=%s nat=%s routes=%s", self.ns, want.nat, want.routes)
            return True

    def _failed(self, why: str) -> None:
        self.stats.errors += 1
        if why != self.stats.last_error:
            log.warning("l3follower.error ns=%s %s", self.ns, why)
        self.stats.last_error = why

    def _run(self) -> None:
        self.sync()
        # the follower's main loop: an Event wait, so stop() ends it at once
        while not self._stop.wait(self.interval):
            self.sync()

    def start(self) -> L3Follower:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"l3follower-{self.ns}", daemon=True)
            self._thread.start()
        return self

    def close(self, clean: bool = True) -> None:
        """Stop polling; with ``clean``, remove the follower's chains and routes (a namespace already gone
        is fine)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout * 4 + 5)
            self._thread = None
        if not clean or self.ns not in netns.list_namespaces():
            return
        for builtin, chain in CHAINS:
            self._nat("-D", builtin, "-j", chain, check=False)
            self._nat("-F", chain, check=False)
            self._nat("-X", chain, check=False)
        netns.run(["ip", "-n", self.ns, "route", "flush", "proto", ROUTE_PROTO], check=False)
        self._hooked = False

    def __enter__(self) -> L3Follower:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
