"""Benchmark of the Kubernetes API emulator (lab.kubeapi) run as its own process, driven over HTTPS.

Loads ~20,000 objects (15,000 ConfigMaps across namespaces + 5,000 VPNGateways), then measures: list of
the 5,000 custom resources (JSON and Table), create and merge-patch latency, watch fan-out to 30 concurrent
watchers (patch -> every watcher has the event), and the server's RSS. Numbers go to docs/kubeapi.md.

    .venv/bin/python bench/bench_kubeapi.py [--configmaps 15000] [--crs 5000] [--watchers 30]
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.api.crds import crds  # noqa: E402

GW = "/apis/vpn.bnerd.net/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
WG = {
    "listenPort": 51820,
    "address": "10.99.0.1/24",
    "privateKeySecretRef": {"name": "gw-wg", "key": "privateKey"},
}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


async def _load(
    c: httpx.AsyncClient, paths_bodies: list[tuple[str, dict[str, Any]]], concurrency: int = 16
) -> float:
    send, recv = anyio.create_memory_object_stream[tuple[str, dict[str, Any]]](len(paths_bodies))
    for pb in paths_bodies:
        send.send_nowait(pb)
    send.close()

    async def worker() -> None:
        async for path, body in recv:
            r = await c.post(path, json=body)
            if r.status_code != 201:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return time.perf_counter() - t0


class Server:
    """The emulator as its own process (so client and server use separate cores)."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-kubeapi-"))
        kc = self.tmp / "kubeconfig"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lab.kubeapi",
                "--kubeconfig",
                str(kc),
                "--history",
                "50000",
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        cfg = yaml.safe_load(kc.read_text())
        ca = self.tmp / "ca.crt"
        ca.write_bytes(base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"]))
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.url = cfg["clusters"][0]["cluster"]["server"]
        self.headers = {"Authorization": f"Bearer {cfg['users'][0]['user']['token']}"}

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


async def run(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    pid = server.proc.pid
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(
        base_url=server.url, verify=server.ctx, headers=server.headers, timeout=120, limits=limits
    ) as c:
        out: dict[str, Any] = {"rss_empty_mib": round(_rss_mib(pid), 1)}
        for crd in crds():
            (
                await c.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
            ).raise_for_status()
        namespaces = [f"t{i}" for i in range(50)]
        for ns in [*namespaces, "bench"]:
            (await c.post("/api/v1/namespaces", json={"metadata": {"name": ns}})).raise_for_status()
        cms = [
            (
                f"/api/v1/namespaces/{namespaces[i % 50]}/configmaps",
                {
                    "metadata": {"name": f"cm-{i}", "labels": {"app": "bench", "n": str(i % 10)}},
                    "data": {"plan": "x" * 512},
                },
            )
            for i in range(args.configmaps)
        ]
        gws = [
            (
                f"{GW}/namespaces/bench/vpngateways",
                {
                    "apiVersion": "vpn.bnerd.net/v1alpha1",
                    "kind": "VPNGateway",
                    "metadata": {"name": f"gw-{i}"},
                    "spec": {"type": "wireguard", "serviceCIDR": "198.18.0.0/24", "wireguard": WG},
                },
            )
            for i in range(args.crs)
        ]
        load_cm = await _load(c, cms)
        load_gw = await _load(c, gws)
        total = args.configmaps + args.crs
        out["load"] = {
            "objects": total,
            "configmap_seconds": round(load_cm, 1),
            "cr_seconds": round(load_gw, 1),
            "creates_per_s": round(total / (load_cm + load_gw)),
        }
        out["rss_loaded_mib"] = round(_rss_mib(pid), 1)
        lists, tables = [], []
        n = size = 0
        for _ in range(5):
            t0 = time.perf_counter()
            r = await c.get(f"{GW}/namespaces/bench/vpngateways")
            n, size = len(r.json()["items"]), len(r.content)
            lists.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await c.get(
                f"{GW}/namespaces/bench/vpngateways",
                headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            )
            tables.append(time.perf_counter() - t0)
        out["list_5000_crs"] = {
            "items": n,
            "bytes": size,
            "json_ms_median": round(statistics.median(lists) * 1000, 1),
            "table_ms_median": round(statistics.median(tables) * 1000, 1),
        }
        t0 = time.perf_counter()
        r = await c.get("/api/v1/configmaps?labelSelector=n%3D3")
        out["list_all_configmaps_label_selector"] = {
            "items": len(r.json()["items"]),
            "ms": round((time.perf_counter() - t0) * 1000, 1),
        }
        creates, patches = [], []
        for i in range(200):
            t0 = time.perf_counter()
            body = {"metadata": {"name": f"lat-{i}"}, "data": {"a": "1"}}
            (await c.post("/api/v1/namespaces/bench/configmaps", json=body)).raise_for_status()
            creates.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            patch = json.dumps({"status": {"nodeName": f"n{i}"}})
            (
                await c.patch(
                    f"{GW}/namespaces/bench/vpngateways/gw-{i}/status", content=patch, headers=MERGE
                )
            ).raise_for_status()
            patches.append(time.perf_counter() - t0)
        out["client_create_ms"] = {
            "p50": round(_pct(creates, 0.5) * 1000, 2),
            "p95": round(_pct(creates, 0.95) * 1000, 2),
        }
        out["client_status_patch_ms"] = {
            "p50": round(_pct(patches, 0.5) * 1000, 2),
            "p95": round(_pct(patches, 0.95) * 1000, 2),
        }
        log = (await c.get("/_emulator/requests?namespace=bench")).json()["items"]
        for key, verb, sub, res in (
            ("create_cr", "create", "", "vpngateways"),
            ("create_configmap", "create", "", "configmaps"),
            ("status_patch", "patch", "status", "vpngateways"),
            ("list_5000_crs", "list", "", "vpngateways"),
        ):
            d = [
                r["duration"]
                for r in log
                if r["verb"] == verb and r["subresource"] == sub and r["resource"] == res
            ][-200:]
            out[f"server_{key}_ms"] = {
                "p50": round(_pct(d, 0.5) * 1000, 2),
                "p95": round(_pct(d, 0.95) * 1000, 2),
            }
        out["fanout"] = await _fanout(c, args.watchers)
        out["rss_end_mib"] = round(_rss_mib(pid), 1)
    return out


@dataclass
class _Round:
    seen: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)


async def _fanout(c: httpx.AsyncClient, watchers: int, rounds: int = 20) -> dict[str, Any]:
    """Each round: one status patch; the time until the last of ``watchers`` watch streams has it."""
    rv = (await c.get("/api/v1/namespaces/bench/configmaps?limit=1")).json()["metadata"]["resourceVersion"]
    ready = anyio.Event()
    connected = 0
    state = _Round()
    path = (
        f"{GW}/namespaces/bench/vpngateways?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Dgw-0"
    )

    async def watch() -> None:
        nonlocal connected
        async with c.stream("GET", path, timeout=None) as r:
            connected += 1
            if connected == watchers:
                ready.set()
            n = 0
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                n += 1
                state.seen += 1
                if state.seen == watchers:
                    state.done.set()
                if n >= rounds:
                    return

    delays: list[float] = []
    async with anyio.create_task_group() as tg:
        for _ in range(watchers):
            tg.start_soon(watch)
        await ready.wait()
        await anyio.sleep(0.2)
        for k in range(rounds):
            state = _Round()
            t0 = time.perf_counter()
            patch = json.dumps({"status": {"publicIP": f"203.0.113.{k}"}})
            (
                await c.patch(f"{GW}/namespaces/bench/vpngateways/gw-0/status", content=patch, headers=MERGE)
            ).raise_for_status()
            await state.done.wait()
            delays.append(time.perf_counter() - t0)
    return {
        "watchers": watchers,
        "patch_to_last_watcher_ms_median": round(statistics.median(delays) * 1000, 2),
        "p95": round(_pct(delays, 0.95) * 1000, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configmaps", type=int, default=15000)
    p.add_argument("--crs", type=int, default=5000)
    p.add_argument("--watchers", type=int, default=30)
    args = p.parse_args()
    server = Server()
    try:
        print(json.dumps(anyio.run(run, args, server), indent=2))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
