# ruff: noqa: E501  (an embedded probe script and a results table)
"""Benchmark: the project's Kubernetes client (gwkit.kube, async on httpx) against the official
``kubernetes`` client, on what the controller and the gateway pod do, against the API emulator.

    .venv/bin/python bench/bench_kube_client.py [--objects 5000] [--repeat 5]

Each client runs in a fresh process: import time and RSS after import; list every VPNPeer (as dicts for
both: CustomObjectsApi returns dicts) and every ConfigMap (the official client builds models for core
kinds); 200 status merge patches in a row; RSS after. Numbers go to docs/controller.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.cluster import Cluster

PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
which, kubeconfig = sys.argv[1], sys.argv[2]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 1024
out = {}
if which == "official":
    import kubernetes
    from kubernetes import client, config
    out["import_s"] = time.perf_counter() - t0
    out["rss_import_kb"] = rss()
    config.load_kube_config(kubeconfig)
    co, core = client.CustomObjectsApi(), client.CoreV1Api()
    t = time.perf_counter(); items = co.list_cluster_custom_object("vpn.bnerd.net", "v1alpha1", "vpnpeers")["items"]
    out["list_crs_s"] = time.perf_counter() - t; out["crs"] = len(items)
    t = time.perf_counter(); cms = core.list_config_map_for_all_namespaces().items
    out["list_cms_s"] = time.perf_counter() - t; out["cms"] = len(cms)
    t = time.perf_counter()
    for i in range(200):
        co.patch_namespaced_custom_object_status("vpn.bnerd.net", "v1alpha1", "bench", "vpngateways", "gw",
                                                 {"status": {"agent": {"n": i}}})
    out["patch_s"] = (time.perf_counter() - t) / 200
else:
    import anyio
    from gwkit.kube import KubeClient, load
    from gwkit.kube.client import CONFIGMAPS, VPNGATEWAYS, VPNPEERS
    from pathlib import Path
    out["import_s"] = time.perf_counter() - t0
    out["rss_import_kb"] = rss()
    async def main():
        async with KubeClient(load(Path(kubeconfig))) as kube:
            t = time.perf_counter(); items, _ = await kube.list(VPNPEERS)
            out["list_crs_s"] = time.perf_counter() - t; out["crs"] = len(items)
            t = time.perf_counter(); cms, _ = await kube.list(CONFIGMAPS)
            out["list_cms_s"] = time.perf_counter() - t; out["cms"] = len(cms)
            t = time.perf_counter()
            for i in range(200):
                await kube.patch(VPNGATEWAYS, "gw", {"status": {"agent": {"n": i}}}, "bench", subresource="status")
            out["patch_s"] = (time.perf_counter() - t) / 200
    anyio.run(main)
out["rss_end_kb"] = rss()
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp)) as c:
        c.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}])
        c.apply([{"apiVersion": "vpn.bnerd.net/v1alpha1", "kind": "VPNGateway", "metadata": {"name": "gw", "namespace": "bench"},
                  "spec": {"type": "wireguard", "serviceCIDR": "198.18.0.0/24",
                           "wireguard": {"listenPort": 51820, "address": "10.99.0.1/24",
                                         "privateKeySecretRef": {"name": "k", "key": "k"}}}}])  # fmt: skip
        for i in range(a.objects):
            c.kube.create({"apiVersion": "vpn.bnerd.net/v1alpha1", "kind": "VPNPeer",
                           "metadata": {"name": f"p{i}", "namespace": "bench"},
                           "spec": {"gatewayRef": {"name": "gw"}, "type": "roadWarrior",
                                    "wireguard": {"publicKey": "ndMB0U9Tj4E4/5wKf/gWNO7jDafzWOAObYzbYEYkUiw=",
                                                  "allowedIPs": [f"10.99.{i // 250}.{i % 250 + 2}/32"]}}})  # fmt: skip
        for i in range(a.objects // 10):
            c.kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}", "namespace": "bench"},
                           "data": {"plan.json": "x" * 4000}})  # fmt: skip
        rows: dict[str, list[dict[str, float]]] = {"gwkit.kube": [], "official": []}
        for _ in range(a.repeat):
            for which in rows:
                res = subprocess.run(
                    [sys.executable, "-c", PROBE, which, str(c.kubeconfig)],
                    capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1],
                )  # fmt: skip
                rows[which].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(
        f"{'client':12} {'import':>8} {'RSS import':>11} {'list CRs':>9} {'list CMs':>9} {'patch':>8} {'RSS end':>8}"
    )
    for which, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"{which:12} {med['import_s'] * 1000:6.0f}ms {med['rss_import_kb'] / 1024:9.1f}MB "
            f"{med['list_crs_s'] * 1000:7.0f}ms {med['list_cms_s'] * 1000:7.0f}ms {med['patch_s'] * 1000:6.2f}ms "
            f"{med['rss_end_kb'] / 1024:6.1f}MB  ({int(med['crs'])} CRs, {int(med['cms'])} ConfigMaps)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
