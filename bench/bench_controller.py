"""Benchmark: the controller (a real process) against the Kubernetes API emulator, many gateways.

    .venv/bin/python bench/bench_controller.py [--gateways 500] [--peers 10] [--edits 50] [--ha]

Measures: cold start (every CR already stored, the controller started) until every gateway has all its
objects and ConfigRendered=True; CR edit (a peer's grant revoked or restored) until the plan ConfigMap
holds it (p50/p99 over ``--edits``); API writes in a no-op resync; the controller's RSS (current and peak).
Targets (issue #13): converged under 60 s, edit p99 under 1 s, zero writes, RSS under 250 MB.
``--ha``: every gateway with ``spec.ha.enabled`` (the controller with ``--allow-ha``, slot b's static NIC2s):
converged means both slots' Deployments and the Lease exist (issue #23: 100 HA gateways).
The emulator runs in this process (its own thread), the controller in its own: both share the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.desired import plan_of
from lab.cluster import Cluster, home_of, secrets_for
from lab.wait import wait_for

VPN = "vpn.bnerd.net/v1alpha1"


def gateway_docs(i: int, peers: int, ha: bool = False) -> list[dict[str, Any]]:
    ns, name = f"tenant-{i // 10}", f"gw{i}"
    gw: dict[str, Any] = {
        "apiVersion": VPN,
        "kind": "VPNGateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "type": "ipsec",
            "serviceCIDR": f"100.{64 + i // 256}.{i % 256}.0/24",  # disjoint: one transit network
            "exposures": [
                {"name": f"svc{j}", "target": {"address": f"192.0.2.{64 + j}"}, "ports": [{"port": 80 + j}]}
                for j in range(4)
            ],
            "ipsec": {
                "localID": f"{name}.lab.example",
                "pskSecretRef": {"name": f"{name}-psk", "key": "psk"},
            },
        },
    }
    if ha:
        gw["spec"]["ha"] = {"enabled": True}
    out = [gw]
    for p in range(peers):
        out.append(
            {
                "apiVersion": VPN,
                "kind": "VPNPeer",
                "metadata": {"name": f"{name}-p{p}", "namespace": ns},
                "spec": {
                    "gatewayRef": {"name": name},
                    "type": "site",
                    "endpoint": f"198.51.{100 + p // 250}.{p % 250 + 1}",
                    "ipsec": {"id": f"p{p}.{name}.example", "remoteSubnets": [f"10.{p}.{i % 250}.0/24"]},
                    "authorization": {"exposures": ["svc0", "svc1"]},
                },
            }
        )
    return out


def rss_kb(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateways", type=int, default=500)
    ap.add_argument("--peers", type=int, default=10)
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--keep", type=Path, help="keep the controller's log and config in this directory")
    ap.add_argument("--ha", action="store_true", help="every gateway with spec.ha.enabled (warm standby)")
    a = ap.parse_args()
    nics = {
        f"tenant-{i // 10}/gw{i}": {
            "mac": f"fa:16:3e:00:{i // 256:02x}:{i % 256:02x}",
            "address": "192.0.2.2/26",
            "gateway": "192.0.2.1",
        }
        for i in range(a.gateways)
    }
    if a.ha:  # slot b's NIC2s: their own MACs and addresses
        nics |= {
            f"tenant-{i // 10}/gw{i}#b": {
                "mac": f"fa:16:3e:01:{i // 256:02x}:{i % 256:02x}",
                "address": "192.0.2.3/26",
                "gateway": "192.0.2.1",
            }
            for i in range(a.gateways)
        }
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(a.keep or Path(tmp), bookmark_interval=60.0, history=200000) as c,
    ):
        for n in range(20):
            c.add_node(f"node-{n:02d}")
        t0 = time.monotonic()
        for i in range(a.gateways):
            docs = gateway_docs(i, a.peers, a.ha)
            c.apply(secrets_for(docs))  # the PSK Secrets, opted in for gateways (the tenant's part)
            c.apply(docs)
        print(f"stored {a.gateways} gateways x {a.peers} peers in {time.monotonic() - t0:.1f} s")
        keys = [(f"tenant-{i // 10}", f"gw{i}") for i in range(a.gateways)]

        def rendered(ns: str, name: str) -> bool:
            gw = c.get(VPN, "VPNGateway", name, ns)
            conds = (gw or {}).get("status", {}).get("conditions") or []
            ok = any(x["type"] == "ConfigRendered" and x["status"] == "True" for x in conds)
            home, home_ns = home_of(name, ns)
            ok = ok and c.get("apps/v1", "Deployment", home, home_ns) is not None
            if a.ha:
                ok = ok and c.get("apps/v1", "Deployment", f"{home}-b", home_ns) is not None
                ok = ok and c.get("coordination.k8s.io/v1", "Lease", home, home_ns) is not None
            return ok

        started = time.monotonic()
        ctl = c.start_controller(
            {"internalSourceCIDRs": ["192.0.2.128/26"], "staticNICs": nics,
             "allowances": {"default": {"exposureTargets": ["192.0.2.64/26"]}}},
            "--workers", str(a.workers), "--resync-seconds", "20", *(["--allow-ha"] if a.ha else []),
        )  # fmt: skip
        pending = set(keys)

        def all_done() -> bool:
            for k in list(pending):
                if rendered(*k):
                    pending.discard(k)
            return not pending

        wait_for(all_done, 600, "every gateway converged", interval=0.2)
        cold = time.monotonic() - started
        print(f"cold start to all {a.gateways} converged: {cold:.1f} s")

        def queue_depth() -> float:
            text = ctl.get("/metrics")[1]
            line = next(x for x in text.splitlines() if x.startswith("vpngw_controller_queue_depth "))
            return float(line.split()[1])

        settle = time.monotonic()
        wait_for(lambda: queue_depth() == 0, 120, "the queue to drain", interval=0.2)
        print(
            f"queue drained {time.monotonic() - settle:.1f} s after convergence "
            "(the reconciles our own writes cause)"
        )
        latencies = []
        for e in range(a.edits):
            ns, name = keys[(e * 37) % len(keys)]
            peer = f"{name}-p{e % a.peers}"
            revoke = e % 2 == 0
            grants = ["svc0"] if revoke else ["svc0", "svc1"]
            c.kube.patch(VPN, "VPNPeer", peer, {"spec": {"authorization": {"exposures": grants}}}, ns)
            t = time.monotonic()

            def landed(ns: str = ns, name: str = name, peer: str = peer, revoke: bool = revoke) -> bool:
                cm = c.get("v1", "ConfigMap", *home_of(name, ns))
                plan = plan_of(cm) if cm else None
                has = plan is not None and any(
                    g.peer == peer and g.exposure == "svc1" for g in plan.nat.grants
                )
                return has != revoke

            wait_for(landed, 30, f"edit {e} in the plan", interval=0.002)
            latencies.append(time.monotonic() - t)
        print("edit latencies (ms, in order):", " ".join(f"{x * 1000:.0f}" for x in latencies))
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"CR edit to ConfigMap written: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max "
              f"{latencies[-1] * 1000:.0f} ms over {len(latencies)} edits")  # fmt: skip
        time.sleep(2)
        mark = c.kube.requests()[-1].seq
        time.sleep(25)  # at least one full resync (every 20 s) of every gateway
        resync_writes = [r for r in c.kube.requests(writes_only=True, since=mark) if r.resource != "leases"]
        reconciles = ctl.get("/metrics")[1]
        total = next(
            (
                line
                for line in reconciles.splitlines()
                if line.startswith('vpngw_controller_reconcile_total{result="ok"}')
            ),
            "",
        )
        rss, peak = rss_kb(ctl.proc.pid)
        print(f"writes during a resync of {a.gateways} gateways: {len(resync_writes)} ({total})")
        print(f"controller RSS: {rss / 1024:.0f} MB now, {peak / 1024:.0f} MB peak")
        ok = cold < 60 and p99 < 1.0 and not resync_writes and peak < 250 * 1024
        print("targets met" if ok else "TARGETS NOT MET")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
