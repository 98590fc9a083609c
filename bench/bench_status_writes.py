"""Benchmark: status writes do not drive reconciles (issue 21, item 4), at scale.

    .venv/bin/python bench/bench_status_writes.py [--gateways 500] [--duration 300] [--quick]

The API emulator (lab.cluster, in this process) holds ``--gateways`` VPNGateways (``--peers`` VPNPeers
each, in ``--namespaces`` tenant namespaces, on ``--nodes`` nodes); the controller runs as a process
(static cloud, ``--resync-seconds`` 3600: no periodic resync falls in the window) and is waited for until
every gateway is reconciled (ConfigRendered=True, its plan ConfigMap holds its peers) and its queue is quiet.

1. Baseline, no status writers: ``--baseline-edits`` gateway edits, one every ``--baseline-interval`` s.
2. Under load, for ``--duration`` s: simulated status-agents (a process of their own, the agent's own
   write path: ``agent.sink.KubeStatusApi`` over ``gwkit.kube``) merge-patch every gateway's ``.status``
   through the status subresource once every ``--period`` s, spread evenly, with counters that grow as the
   status-agent's tunnels/bytes do; meanwhile one gateway's spec is edited every ``--edit-interval`` s.

An edit alternates between changing an exposure's port (the VPNGateway's spec) and adding/removing a
VPNPeer; its latency is from the write until the gateway's plan ConfigMap (gateway namespace) holds it.
Reconciles come from the controller's /metrics (vpngw_controller_reconcile_total by result), its writes
from /metrics (vpngw_controller_api_writes_total) and from the emulator's request log (every write by the
controller's identity but its Lease); what the edits themselves cause is measured in the baseline (per
edit) and subtracted: the rest is what the status writes caused. Expected: 0 reconciles/s, 0 writes/s
(a controller that reconciled on every status write would show about gateways / period reconciles/s:
16.7/s at 500 and 30 s), and edit -> ConfigMap latencies under load like the baseline's.

Every process shares the machine (the emulator and this script, the controller, the writers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from controller.desired import plan_of
from lab.cluster import ROOT, Cluster, Controller, home_of, secrets_for
from lab.kubeapi.rbac import MASTERS
from lab.wait import wait_for

VPN = "vpn.bnerd.net/v1alpha1"
WRITER = "bench-status-agent"
CONTROLLER_USER = "kubernetes-admin"  # the controller runs with the emulator's admin kubeconfig
TICK = os.sysconf("SC_CLK_TCK")


def gateway_docs(i: int, peers: int, namespaces: int) -> list[dict[str, Any]]:
    ns, name = f"tenant-{i % namespaces}", f"gw{i}"
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": VPN,
            "kind": "VPNGateway",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "type": "ipsec",
                "serviceCIDR": f"100.{64 + i // 256}.{i % 256}.0/24",  # disjoint: one transit network
                "exposures": [
                    {"name": "web", "target": {"address": "192.0.2.66"}, "ports": [{"port": 80}]},
                    {"name": "db", "target": {"address": "192.0.2.67"}, "ports": [{"port": 5432}]},
                ],
                "ipsec": {
                    "localID": f"{name}.lab.example",
                    "pskSecretRef": {"name": f"{name}-psk", "key": "psk"},
                },
            },
        }
    ]
    docs += [peer_doc(i, p, namespaces) for p in range(peers)]
    return docs


def peer_doc(i: int, p: int, namespaces: int) -> dict[str, Any]:
    name = f"gw{i}"
    return {
        "apiVersion": VPN,
        "kind": "VPNPeer",
        "metadata": {"name": f"{name}-p{p}", "namespace": f"tenant-{i % namespaces}"},
        "spec": {
            "gatewayRef": {"name": name},
            "type": "site",
            "endpoint": f"198.51.100.{p + 1}",
            "ipsec": {
                "id": f"p{p}.{name}.example",
                "remoteSubnets": [f"10.{i // 250}.{i % 250}.{p * 16}/28"],
            },
            "authorization": {"exposures": ["web", "db"]},
        },
    }


# --- the simulated status-agents (a process of their own) ------------------------------------------------


def status_document(i: int, peers: int, rnd: int, period: float) -> dict[str, Any]:
    """What gateway ``i``'s status-agent writes in its round ``rnd``: its tunnels up, counters growing."""
    t = rnd * period
    tunnels = []
    for p in range(peers):
        rate = 1000 * (i % 97 + 1) * (p + 1)  # bytes/s, different per tunnel
        tunnels.append(
            {
                "name": f"gw{i}-p{p}",
                "state": "Established",
                "establishedAt": "2026-01-01T00:00:00Z",
                "rekeyAt": f"2026-01-01T{1 + rnd % 20:02d}:00:00Z",
                "bytesIn": int(rate * t),
                "bytesOut": int(rate * t * 0.7),
                "packetsIn": int(rate * t / 900),
                "packetsOut": int(rate * t / 1200),
                "children": [
                    {
                        "name": f"gw{i}-p{p}",
                        "remoteSubnet": f"10.{i // 250}.{i % 250}.{p * 16}/28",
                        "state": "Established",
                    }
                ],
                "lastError": None,
            }
        )
    agent = {"connected": True, "daemon": "charon 5.9.8", "planHash": "sha256:bench", "lastError": None}
    return {"tunnels": tunnels, "agent": agent}


def serve_writers(spec_file: str) -> None:
    """``--serve-writers SPEC``: write every gateway's status every ``period`` s for ``duration`` s; print
    ``ready``, start on a line on stdin, then (at the end) a JSON line with what was written."""
    import anyio

    from agent.sink import KubeStatusApi, StatusWriteError
    from gwkit.kube import KubeClient, load
    from gwplan import GatewayRef

    spec = json.loads(Path(spec_file).read_text())
    targets: list[tuple[int, str, str]] = [(int(i), str(ns), str(nm)) for i, ns, nm in spec["targets"]]
    period, duration, peers = float(spec["period"]), float(spec["duration"]), int(spec["peers"])
    out: dict[str, Any] = {"ok": 0, "errors": {}, "latency": [], "late": []}
    errors: Counter[str] = Counter()

    async def main() -> None:
        async with KubeClient(load(Path(spec["kubeconfig"])), user_agent=WRITER) as kube:
            api = KubeStatusApi(kube)
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)  # "go": once the window is marked

            async def one(i: int, ns: str, name: str, rnd: int) -> None:
                t0 = anyio.current_time()
                try:
                    await api.patch_status(
                        GatewayRef("VPNGateway", VPN, ns, name), status_document(i, peers, rnd, period)
                    )
                    out["ok"] += 1
                    out["latency"].append(anyio.current_time() - t0)
                except StatusWriteError as exc:
                    errors[str(exc)] += 1

            start = anyio.current_time()
            n = len(targets)
            async with anyio.create_task_group() as tg:
                k = 0
                # A deliberate paced schedule (the writers' load at a fixed rate), not a wait for a
                # condition (allowed in tests/unit/test_no_polling_loops.py).
                while True:
                    rnd, j = divmod(k, n)
                    due = start + rnd * period + j * period / n
                    if due - start >= duration:
                        break
                    await anyio.sleep_until(due)
                    out["late"].append(anyio.current_time() - due)
                    tg.start_soon(one, *targets[j], rnd)
                    k += 1
            out["elapsed"] = anyio.current_time() - start

    anyio.run(main)
    out["errors"] = dict(errors)
    print(json.dumps(out), flush=True)


# --- measuring ---------------------------------------------------------------------------------------------


def metric_samples(ctl: Controller) -> dict[tuple[str, str], float]:
    """(sample name, its one label value or "") -> value, for the reconcile and write counters."""
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(ctl.get("/metrics")[1]):
        for s in fam.samples:
            if s.name in ("vpngw_controller_reconcile_total", "vpngw_controller_api_writes_total"):
                out[(s.name, next(iter(s.labels.values()), ""))] = s.value
            elif s.name == "vpngw_controller_queue_depth":
                out[(s.name, "")] = s.value
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Mark:
    """The counters at one moment: the controller's metrics, the emulator's request log, CPU."""

    def __init__(self, c: Cluster, ctl: Controller) -> None:
        self.time = time.monotonic()
        self.metrics = metric_samples(ctl)
        self.seq = c.kube.requests()[-1].seq
        self.cpu_ctl = cpu_seconds(ctl.proc.pid)
        self.cpu_self = sum(os.times()[:2])


class Window:
    """What happened between two marks; ``edited``: the (namespace, name) of the gateways edited then."""

    def __init__(self, c: Cluster, a: Mark, b: Mark, owners: Mapping[str, tuple[str, str]],
                 edited: set[tuple[str, str]]) -> None:  # fmt: skip
        self.seconds = b.time - a.time
        d = {k: b.metrics.get(k, 0.0) - a.metrics.get(k, 0.0) for k in b.metrics}
        self.reconciles = {
            lbl: int(v) for (n, lbl), v in sorted(d.items()) if n == "vpngw_controller_reconcile_total" and v
        }
        self.metric_writes = {
            lbl: int(v) for (n, lbl), v in sorted(d.items()) if n == "vpngw_controller_api_writes_total" and v
        }
        recs = [r for r in c.kube.requests(since=a.seq) if r.seq <= b.seq]
        self.log_complete = not recs or recs[0].seq == a.seq + 1
        writes = [r for r in recs if r.user == CONTROLLER_USER and r.verb in WRITE_VERBS]
        self.log_writes = Counter(
            f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
            for r in writes
            if r.resource != "leases"
        )
        self.status_patches = sum(
            1
            for r in recs
            if r.user == WRITER and r.verb == "patch" and r.subresource == "status" and r.code == 200
        )
        self.status_failed = sum(1 for r in recs if r.user == WRITER and r.code != 200)
        # Each write's gateway: its CR, its objects in the gateway namespace (by name), its Role and
        # RoleBinding (vpngw-<name>) and Events (<name>.<suffix>) in its namespace; unknown: not edited.
        self.unedited = Counter(
            f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
            for r in writes
            if r.resource != "leases" and gateway_of(r.resource, r.namespace, r.name, owners) not in edited
        )
        self.cpu_ctl = b.cpu_ctl - a.cpu_ctl
        self.cpu_self = b.cpu_self - a.cpu_self

    @property
    def n_reconciles(self) -> int:
        return sum(self.reconciles.values())

    @property
    def n_metric_writes(self) -> int:
        return sum(self.metric_writes.values())

    @property
    def n_log_writes(self) -> int:
        return sum(self.log_writes.values())


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def gateway_of(
    resource: str, namespace: str, name: str, owners: Mapping[str, tuple[str, str]]
) -> tuple[str, str] | None:
    if name in owners:
        return owners[name]
    if resource == "vpngateways":
        return namespace, name
    if resource == "vpnpeers":
        return namespace, name.rsplit("-p", 1)[0]
    if resource in ("roles", "rolebindings"):
        return namespace, name.removeprefix("vpngw-")
    if resource == "events":
        return namespace, name.split(".", 1)[0]
    return None


class Editor:
    """Edits gateways' specs, one at a time, and times each until the plan ConfigMap holds it."""

    def __init__(self, c: Cluster, gateways: int, peers: int, namespaces: int) -> None:
        self.c, self.n, self.peers, self.namespaces = c, gateways, peers, namespaces
        self.port: dict[int, int] = {}
        self.extra: set[int] = set()
        self.count = 0
        self.edited: set[tuple[str, str]] = set()

    def edit(self, i: int) -> tuple[str, float]:
        """One edit of gateway ``i`` (alternating kinds); its latency in seconds."""
        c, ns, name = self.c, f"tenant-{i % self.namespaces}", f"gw{i}"
        kind = self.count % 2
        self.count += 1
        self.edited.add((ns, name))
        cm0 = c.owned("v1", "ConfigMap", name, ns)
        assert cm0 is not None
        seen = [cm0["metadata"]["resourceVersion"]]
        check: Callable[[Any], bool]
        if kind == 0:
            port = 8080 if self.port.get(i, 80) == 80 else 80
            self.port[i] = port
            exposures = [
                {"name": "web", "target": {"address": "192.0.2.66"}, "ports": [{"port": port}]},
                {"name": "db", "target": {"address": "192.0.2.67"}, "ports": [{"port": 5432}]},
            ]
            what = f"exposure web of {ns}/{name} to port {port}"

            def check(plan: Any) -> bool:
                return any(e.name == "web" and e.ports[0].port == port for e in plan.nat.exposures)

            t0 = time.monotonic()
            c.kube.patch(VPN, "VPNGateway", name, {"spec": {"exposures": exposures}}, ns)
        else:
            extra = peer_doc(i, self.peers + 1, self.namespaces)
            peer = extra["metadata"]["name"]
            add = i not in self.extra
            what = f"peer {ns}/{peer} {'added' if add else 'removed'}"

            def check(plan: Any) -> bool:
                return (peer in {t.name for t in plan.ipsec.tunnels}) == add

            t0 = time.monotonic()
            if add:
                c.kube.create(extra)
                self.extra.add(i)
            else:
                c.kube.delete(VPN, "VPNPeer", peer, ns)
                self.extra.discard(i)

        def landed() -> bool:
            cm = c.owned("v1", "ConfigMap", name, ns)
            if cm is None or cm["metadata"]["resourceVersion"] == seen[0]:
                return False
            seen[0] = cm["metadata"]["resourceVersion"]
            return check(plan_of(cm))

        wait_for(landed, 60, what, interval=0.005)
        return what, time.monotonic() - t0


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


def lat_text(xs: list[float]) -> str:
    if not xs:
        return "-"
    return (
        f"p50 {statistics.median(xs) * 1000:.0f} ms, p99 {pct(xs, 0.99) * 1000:.0f} ms, "
        f"max {max(xs) * 1000:.0f} ms (n={len(xs)})"
    )


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-writers":
        serve_writers(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateways", type=int, default=500)
    ap.add_argument("--peers", type=int, default=2, help="VPNPeers per gateway")
    ap.add_argument("--namespaces", type=int, default=10, help="tenant namespaces (gateways round-robin)")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of status writes")
    ap.add_argument("--period", type=float, default=30.0, help="each gateway's status every this many s")
    ap.add_argument("--edit-interval", type=float, default=10.0, help="one spec edit this often, under load")
    ap.add_argument("--baseline-edits", type=int, default=30)
    ap.add_argument("--baseline-interval", type=float, default=2.0)
    ap.add_argument("--workers", type=int, default=4, help="the controller's (its default)")
    ap.add_argument("--resync-seconds", type=float, default=3600.0, help="longer than the run: no resync")
    ap.add_argument("--quick", action="store_true", help="smoke run: 50 gateways, 60 s, 12 baseline edits")
    ap.add_argument("--keep", type=Path, help="keep the controller's log and config in this directory")
    if "--quick" in sys.argv[1:]:  # other defaults; flags given still win
        ap.set_defaults(gateways=50, duration=60.0, nodes=5, namespaces=5, baseline_edits=12)
    a = ap.parse_args()
    n = a.gateways
    nics = {
        f"tenant-{i % a.namespaces}/gw{i}": {
            "mac": f"fa:16:3e:00:{i // 256:02x}:{i % 256:02x}",
            "address": "192.0.2.2/26",
            "gateway": "192.0.2.1",
        }
        for i in range(n)
    }
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start "
        "(other sessions may run tests at the same time)"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(a.keep or Path(tmp), bookmark_interval=60.0, history=200000) as c,
    ):
        for k in range(a.nodes):
            c.add_node(f"node-{k:02d}")
        t0 = time.monotonic()
        for i in range(n):
            docs = gateway_docs(i, a.peers, a.namespaces)
            c.apply([*secrets_for(docs), *docs])
        print(f"stored {n} gateways x {a.peers} peers in {a.namespaces} namespaces, {a.nodes} nodes, "
              f"in {time.monotonic() - t0:.1f} s")  # fmt: skip
        started = time.monotonic()
        ctl = c.start_controller(
            {"internalSourceCIDRs": ["192.0.2.128/26"], "staticNICs": nics,
             "allowances": {"default": {"exposureTargets": ["192.0.2.64/26"]}}},
            "--workers", str(a.workers), "--resync-seconds", f"{a.resync_seconds:g}",
        )  # fmt: skip
        pending = {i for i in range(n)}

        def reconciled(i: int) -> bool:
            ns, name = f"tenant-{i % a.namespaces}", f"gw{i}"
            gw = c.get(VPN, "VPNGateway", name, ns) or {}
            conds = (gw.get("status") or {}).get("conditions") or []
            if not any(x["type"] == "ConfigRendered" and x["status"] == "True" for x in conds):
                return False
            cm = c.owned("v1", "ConfigMap", name, ns)
            plan = plan_of(cm) if cm else None
            want = {f"{name}-p{p}" for p in range(a.peers)}
            return (
                plan is not None and plan.ipsec is not None and {t.name for t in plan.ipsec.tunnels} == want
            )

        def all_done() -> bool:
            if ctl.proc.poll() is not None:
                raise SystemExit(f"the controller exited:\n{ctl.log()[-3000:]}")
            for i in list(pending):
                if reconciled(i):
                    pending.discard(i)
            return not pending

        print(f"controller: --workers {a.workers} --resync-seconds {a.resync_seconds:g} (static cloud)")
        wait_for(all_done, 900, "every gateway reconciled", interval=0.5)
        print(f"controller started; all {n} gateways reconciled after {time.monotonic() - started:.1f} s")

        def quiet() -> bool:
            m1 = metric_samples(ctl)
            time.sleep(3)
            m2 = metric_samples(ctl)
            return m1 == m2 and m2.get(("vpngw_controller_queue_depth", ""), 1) == 0

        wait_for(quiet, 120, "the controller to be quiet (no reconcile for 3 s)", interval=0)
        print(f"quiet (no reconcile for 3 s) {time.monotonic() - started:.1f} s after start")
        editor = Editor(c, n, a.peers, a.namespaces)
        owners = {home_of(f"gw{i}", f"tenant-{i % a.namespaces}")[0]: (f"tenant-{i % a.namespaces}", f"gw{i}")
                  for i in range(n)}  # fmt: skip

        # 1. Baseline: edits alone.
        m0 = Mark(c, ctl)
        base_lat: list[float] = []
        for e in range(a.baseline_edits):
            t = time.monotonic()
            base_lat.append(editor.edit((e * 37 + 11) % n)[1])
            time.sleep(max(0.0, a.baseline_interval - (time.monotonic() - t)))
        time.sleep(2)  # the reconciles the last edit's own writes cause
        base = Window(c, m0, Mark(c, ctl), owners, editor.edited)
        per_edit_r = base.n_reconciles / max(1, len(base_lat))
        per_edit_mw = base.n_metric_writes / max(1, len(base_lat))
        per_edit_lw = base.n_log_writes / max(1, len(base_lat))
        print(f"baseline: {len(base_lat)} edits in {base.seconds:.0f} s, no status writers")

        # 2. Under status writes.
        token = c.kube.user_token(WRITER, (MASTERS,))
        kc = c.kube.write_kubeconfig(Path(tmp) / "writer.kubeconfig", token, user=WRITER)
        spec = Path(tmp) / "writers.json"
        spec.write_text(json.dumps({
            "kubeconfig": str(kc), "period": a.period, "duration": a.duration, "peers": a.peers,
            "targets": [(i, f"tenant-{i % a.namespaces}", f"gw{i}") for i in range(n)],
        }))  # fmt: skip
        writers = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-writers", str(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            text=True,
        )
        assert writers.stdout is not None and writers.stdin is not None
        try:
            line = writers.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"the writers did not start: {line!r}")
            m1 = Mark(c, ctl)
            editor.edited = set()
            writers.stdin.write("go\n")
            writers.stdin.flush()
            load_lat: list[float] = []
            e = 0
            # A deliberate paced schedule (one edit every edit_interval during the load window), not a
            # wait for a condition (allowed in tests/unit/test_no_polling_loops.py).
            while True:
                due = m1.time + a.edit_interval / 2 + e * a.edit_interval
                if due >= m1.time + a.duration - 1:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                load_lat.append(editor.edit((e * 53 + 7) % n)[1])
                e += 1
            result = json.loads(writers.stdout.readline())
            writers.wait(30)
        finally:
            if writers.poll() is None:
                writers.kill()
                writers.wait()
        time.sleep(2)  # the reconciles the last edit's own writes cause
        load = Window(c, m1, Mark(c, ctl), owners, editor.edited)
        print(f"under load: {len(load_lat)} edits in {load.seconds:.0f} s with status writers "
              f"(every gateway every {a.period:g} s)")  # fmt: skip

        # The table.
        rows: list[tuple[str, str, str]] = []

        def row(what: str, b: str, l_: str) -> None:
            rows.append((what, b, l_))

        def rate(x: float, w: Window) -> str:
            return f"{x} ({x / w.seconds:.2f}/s)"

        row("window (s)", f"{base.seconds:.0f}", f"{load.seconds:.0f}")
        row("spec edits", str(len(base_lat)), str(len(load_lat)))
        row("status patches delivered (emulator log)", "0", rate(load.status_patches, load))
        row("status patches failed", "0", str(load.status_failed + sum(result["errors"].values())))
        row("reconciles, by result", str(base.reconciles or "{}"), str(load.reconciles or "{}"))
        row(
            "reconciles/s",
            f"{base.n_reconciles / base.seconds:.2f}",
            f"{load.n_reconciles / load.seconds:.2f}",
        )
        row("controller writes (metrics)", str(base.metric_writes or "{}"), str(load.metric_writes or "{}"))
        row("controller writes (emulator log)", str(base.n_log_writes), str(load.n_log_writes))
        row("controller writes/s (emulator log)", f"{base.n_log_writes / base.seconds:.2f}",
            f"{load.n_log_writes / load.seconds:.2f}")  # fmt: skip
        row(
            "controller writes to gateways not edited",
            str(sum(base.unedited.values())),
            str(sum(load.unedited.values())) + (f" {dict(load.unedited)}" if load.unedited else ""),
        )
        row("per edit: reconciles / writes (log)", f"{per_edit_r:.2f} / {per_edit_lw:.2f}", "")
        extra_r = load.n_reconciles - per_edit_r * len(load_lat)
        extra_w = load.n_log_writes - per_edit_lw * len(load_lat)
        extra_mw = load.n_metric_writes - per_edit_mw * len(load_lat)
        row("reconciles/s from status writes", "", f"{extra_r / load.seconds:.2f} ({extra_r:+.0f})")
        row("controller writes/s from status writes", "",
            f"{extra_w / load.seconds:.2f} ({extra_w:+.0f} log, {extra_mw:+.0f} metrics)")  # fmt: skip
        row("edit -> plan ConfigMap", lat_text(base_lat), lat_text(load_lat))

        def cpu(x: float, w: Window) -> str:
            return f"{x:.1f} s ({100 * x / w.seconds:.0f}% of one core)"

        row("controller CPU", cpu(base.cpu_ctl, base), cpu(load.cpu_ctl, load))
        row("emulator + this script CPU", cpu(base.cpu_self, base), cpu(load.cpu_self, load))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in [*rows, ("", "baseline (no status writes)", "")])
        print()
        print(f"{'':{w0}}  {'baseline (no status writes)':{w1}}  under status writes")
        for what, b, l_ in rows:
            print(f"{what:{w0}}  {b:{w1}}  {l_}")
        print()
        lat = result["latency"]
        late = pct(result["late"] or [0.0], 0.99)
        print(
            f"status writers: {result['ok']} patches ok in {result.get('elapsed', 0):.0f} s, patch latency "
            f"{lat_text(lat)}, start lateness p99 {late * 1000:.0f} ms, errors {result['errors'] or 0}"
        )
        if load.log_writes:
            print("controller writes under load by request:", dict(sorted(load.log_writes.items())))
        if not (base.log_complete and load.log_complete):
            print("WARNING: the emulator's request log dropped records in a window: its counts are low")
        print(f"load average at end: {os.getloadavg()[0]:.2f} (2 cores; other sessions may run tests)")
        ok = extra_r / load.seconds < 0.1 and extra_w / load.seconds < 0.1 and load.status_patches > 0
        print("status writes drove no reconciles" if ok else "STATUS WRITES DROVE RECONCILES")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
