"""WireGuard agent numbers on this machine: ``python bench/bench_wireguard.py [--peers N] [--repeat R]``.

Runs a live wireguard-go in a throwaway lab namespace (root needed) and measures, for N peers:
* apply to an empty device (what a start or a wireguard-go restart costs): pure diff, UAPI set;
* ``get`` of the full device (every agent step does one) and parsing it;
* an idle step's pure work (diff with nothing to do + status.peers);
* a reload that removes one peer (the diff is one line; the other N-1 are untouched);
* the kernel backend's pyroute2 side (encoding one ``set()`` per peer) against the in-memory kernel fake
  (no WireGuard module here, so this is pyroute2's cost only, not the kernel's).
Prints one line per measurement: median and max over R repeats, in milliseconds.
"""

from __future__ import annotations

import argparse
import base64
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.runtime import Settings
from agent.sources import FileSecrets
from agent.wireguard.diff import diff
from agent.wireguard.run import WireGuardAgent
from agent.wireguard.status import peers_status
from gwkit.wireguard.backend import NetlinkBackend, UapiBackend, WireGuardBackend
from gwkit.wireguard.fakes import FakeKernelWireGuard, FakeLinks
from gwkit.wireguard.model import DesiredDevice, DesiredPeer, DeviceState
from gwkit.wireguard.netdev import IpRouteNetDev
from gwplan import GatewayRef, Plan, SecretRef, WgPeer, WireGuard
from lab.world import Lab


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def desired(n: int) -> tuple[DesiredDevice, list[WgPeer]]:
    peers, plan_peers = [], []
    for i in range(n):
        k = key()
        ips = (
            f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}/32",
            f"172.{16 + i // 4096}.{i // 16 % 256}.{i % 16 * 16}/28",
        )
        peers.append(DesiredPeer(k, ips, f"198.51.{i // 256 % 256}.{i % 256}:51820", key(), 25))
        plan_peers.append(WgPeer(f"peer-{i}", k, ips))
    priv = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
    return DesiredDevice(priv, 51820, tuple(peers)), plan_peers


def report(what: str, samples: list[float]) -> None:
    print(
        f"{what:<58} median {statistics.median(samples) * 1000:8.2f} ms   max {max(samples) * 1000:8.2f} ms"
    )


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


def timed_sync(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def bench(n: int, repeat: int) -> None:
    want, plan_peers = desired(n)
    print(f"# {n} peers (2 allowed IPs, endpoint, preshared key, keepalive each), {repeat} repeats")
    with Lab() as lab:
        wgo = lab.start_wireguard(lab.gw)
        backend = UapiBackend(wgo.uapi_dir, timeout=60)
        s: dict[str, list[float]] = {k: [] for k in ("diff0", "apply0", "get", "idle", "status", "rm1")}
        fewer = DesiredDevice(want.private_key, want.listen_port, want.peers[1:])
        for _ in range(repeat):
            wgo.kill()
            wgo.start()
            empty = await backend.get("wg0")
            s["diff0"].append(timed_sync(functools.partial(diff, want, empty)))
            update = diff(want, empty)
            s["apply0"].append(await timed(functools.partial(backend.apply, "wg0", update)))
            state: DeviceState = await backend.get("wg0")
            s["get"].append(await timed(functools.partial(backend.get, "wg0")))
            assert diff(want, state).empty
            s["idle"].append(timed_sync(functools.partial(diff, want, state)))
            s["status"].append(timed_sync(functools.partial(peers_status, plan_peers, state, time.time())))
            s["rm1"].append(await timed(functools.partial(apply_diff, backend, fewer)))
        report("pure diff, empty device -> N peers", s["diff0"])
        report("UAPI apply N new peers (one set=1 request)", s["apply0"])
        report("UAPI get + parse of N peers", s["get"])
        report("pure diff, nothing changed (every step)", s["idle"])
        report("pure status.peers for N peers (every step)", s["status"])
        report("reload removing 1 peer: get + diff + apply", s["rm1"])
        await agent_steps(lab, wgo.uapi_dir, plan_peers, want, repeat)
    kernel_samples = []
    for _ in range(repeat):
        kernel = FakeKernelWireGuard(per_message=64)
        nl = NetlinkBackend(kernel, FakeLinks({"wg0"}, kernel=kernel))
        update = diff(want, await nl.get("wg0"))
        kernel_samples.append(await timed(functools.partial(nl.apply, "wg0", update)))
    report("netlink apply N peers, pyroute2 encode + fake kernel", kernel_samples)


async def apply_diff(backend: UapiBackend, want: DesiredDevice) -> None:
    await backend.apply("wg0", diff(want, await backend.get("wg0")))


class _Sink:
    async def publish(self, status: Mapping[str, Any]) -> None:
        return None


class _Health:
    def beat(self) -> None:
        return None

    def set_ready(self, ready: bool, reason: str) -> None:
        return None


async def agent_steps(
    lab: Lab, uapi_dir: Path, plan_peers: list[WgPeer], want: DesiredDevice, repeat: int
) -> None:
    """The whole agent step as it runs every poll interval: real secret files, UAPI, rtnetlink."""
    with tempfile.TemporaryDirectory() as tmp:
        secrets = Path(tmp)
        (secrets / "gw").mkdir()
        (secrets / "gw" / "privateKey").write_text(want.private_key + "\n")
        peers = []
        for p, d in zip(plan_peers, want.peers, strict=True):
            (secrets / p.name).mkdir()
            (secrets / p.name / "psk").write_text(str(d.preshared_key) + "\n")
            peers.append(replace(p, endpoint=d.endpoint, preshared_key_ref=SecretRef(p.name, "psk")))
        plan = Plan(
            gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "bench", "gw"),
            type="wireguard",
            wireguard=WireGuard("wg0", 51820, "10.99.0.1/16", SecretRef("gw", "privateKey"), tuple(peers)),
        )
        settings = Settings(plan=secrets / "plan.json", secrets_dir=secrets, wireguard_uapi_dir=uapi_dir)

        async def uapi(interface: str, directory: Path | None) -> WireGuardBackend:
            return UapiBackend(uapi_dir, timeout=60)

        agent = WireGuardAgent(
            settings,
            FileSecrets(secrets),
            _Sink(),
            _Health(),
            open_backend=uapi,
            netdev=IpRouteNetDev(lab.gw.ns),
        )
        agent.plan = plan
        first = await timed(agent.step)
        idle = [await timed(agent.step) for _ in range(max(repeat, 5))]
        report("agent first step (secrets, validate, apply, addr/routes)", [first])
        report("agent idle step (re-read secrets, get, diff, status)", idle)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--peers", type=int, default=1000, help="peers on the device (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="repeats per measurement (default: %(default)s)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_wireguard: needs root (network namespaces, wireguard-go)", file=sys.stderr)
        return 2
    anyio.run(bench, args.peers, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
