"""Benchmark: what the agent's read-only sockets add to a scrape (docs/exporter.md, "Privileges").

* IPsec: a lab charon pair with IKES IKE_SAs (one CHILD_SA each by default), for each count in
  ``--ikes``. One raw ``list-sas`` read (request out, every byte in, no decoding; bench_exporter's floor)
  straight off charon's socket and through the VICI relay (``agent.ipsec.relay``), then one exporter
  scrape (HTTP GET /metrics of ``python -m exporter``) against each.
* WireGuard: a wireguard-go interface with N peers for each N in ``--peers``. One raw ``get=1`` off
  wireguard-go's socket and through the read-only UAPI socket (``agent.wireguard.readonly``, which
  redacts the keys), then one scrape against each.

The relay and the UAPI server run in their own process, as in the pod (the agent's), so their CPU is
theirs (``cpu/op``: /proc utime + stime per relayed operation, both the raw read and the scrape). Each
round runs the four operations in turn, so all see the same machine load; medians of ``--repeat`` rounds.
Needs root (network namespaces).

    .venv/bin/python bench/bench_readonly.py [--repeat 31] [--ikes 50,200] [--peers 1000,10000]
"""

from __future__ import annotations

import argparse
import os
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_exporter as be

from lab.wait import WaitTimeout, wait_for
from lab.world import Lab

REPO = Path(__file__).resolve().parents[1]


def serve_relay(ro: str, charon: str) -> None:
    """``--serve-relay``: the relay alone, in this process."""
    from agent.ipsec import relay

    anyio.run(relay.serve, Path(ro), Path(charon))


def serve_uapi(ro: str, interface: str, uapi_dir: str) -> None:
    """``--serve-uapi``: the read-only UAPI socket alone, in this process."""
    from agent.wireguard import readonly

    anyio.run(readonly.serve_interface, Path(ro), interface, readonly.opener(Path(uapi_dir)))


class Server:
    def __init__(self, *args: str, socket: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, *args], cwd=REPO)
        proc = self.proc

        def accepts() -> bool:
            # The socket file exists from bind(), before listen(): only a connect that succeeds says it
            # listens (the fixed 0.2 s sleep after the file showed up only guessed). Refused/absent: not yet.
            if proc.poll() is not None:
                raise RuntimeError(f"the read-only server exited with {proc.returncode} before it listened")
            with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
                s.connect(str(socket))
            return True

        try:
            wait_for(accepts, 20, f"the read-only server to listen on {socket}", ignoring=(OSError,))
        except WaitTimeout as e:
            raise RuntimeError("the read-only server did not start") from e

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def rounds(ops: list[Callable[[], Any]], repeat: int) -> list[float]:
    times: list[list[float]] = [[] for _ in ops]
    for _ in range(repeat):
        for i, op in enumerate(ops):
            t0 = time.perf_counter()
            op()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def report(label: str, raw: tuple[float, float], scrape: tuple[float, float], cpu: float, size: int) -> None:
    (rd, rr), (sd, sr) = raw, scrape
    print(
        f"{label:<26} raw {rd * 1e3:7.2f} -> {rr * 1e3:7.2f} ms (+{(rr - rd) * 1e3:5.2f})   "
        f"scrape {sd * 1e3:7.2f} -> {sr * 1e3:7.2f} ms (+{(sr - sd) * 1e3:5.2f}, x{sr / sd:.2f})   "
        f"server cpu {cpu * 1e3:5.2f} ms/op   {size / 1e3:8.1f} kB",
        flush=True,
    )


def ipsec(ikes: int, children: int, repeat: int) -> None:
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="bench-ro-") as tmp:
        t0 = time.monotonic()
        control = anyio.run(be.setup_ipsec, lab, ikes, children)
        print(f"# {ikes} IKE_SAs x {children} CHILD_SAs up in {time.monotonic() - t0:.1f}s", flush=True)
        ro = Path(tmp) / "charon.vici"
        server = Server("--serve-relay", str(ro), str(control), socket=ro)
        direct = be.ExporterProcess("--vici-socket", str(control))
        relayed = be.ExporterProcess("--vici-socket", str(ro))
        try:
            size = be.raw_list_sas(control)
            assert be.raw_list_sas(ro) == size, "the relay passes every byte"
            assert be.series(be.http_get(direct.port)) == be.series(be.http_get(relayed.port)) > ikes
            cpu0 = be.cpu_seconds(server.proc.pid)
            rd, rr, sd, sr = rounds(
                [
                    lambda: be.raw_list_sas(control),
                    lambda: be.raw_list_sas(ro),
                    lambda: be.http_scrape(direct.port),
                    lambda: be.http_scrape(relayed.port),
                ],
                repeat,
            )
            cpu = (be.cpu_seconds(server.proc.pid) - cpu0) / (2 * repeat)
            report(f"ipsec {ikes} IKE_SAs x{children}", (rd, rr), (sd, sr), cpu, size)
        finally:
            direct.stop()
            relayed.stop()
            server.stop()


def wireguard(peers: int, repeat: int) -> None:
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="bench-ro-") as tmp:
        name = "wgb0"
        uapi_dir, sock = be.setup_wireguard(lab, peers, name)
        ro = Path(tmp) / f"{name}.sock"
        server = Server("--serve-uapi", tmp, name, str(uapi_dir), socket=ro)
        direct = be.ExporterProcess("--wireguard-interface", name, "--wireguard-uapi-dir", str(uapi_dir))
        relayed = be.ExporterProcess("--wireguard-interface", name, "--wireguard-uapi-dir", tmp)
        try:
            size = be.raw_uapi_get(sock)
            assert be.series(be.http_get(direct.port)) == be.series(be.http_get(relayed.port)) > peers
            cpu0 = be.cpu_seconds(server.proc.pid)
            rd, rr, sd, sr = rounds(
                [
                    lambda: be.raw_uapi_get(sock),
                    lambda: be.raw_uapi_get(ro),
                    lambda: be.http_scrape(direct.port),
                    lambda: be.http_scrape(relayed.port),
                ],
                repeat,
            )
            cpu = (be.cpu_seconds(server.proc.pid) - cpu0) / (2 * repeat)
            report(f"wireguard {peers} peers", (rd, rr), (sd, sr), cpu, size)
        finally:
            direct.stop()
            relayed.stop()
            server.stop()
            lab.gw.wireguard[name].stop()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-relay":
        serve_relay(*sys.argv[2:4])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-uapi":
        serve_uapi(*sys.argv[2:5])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=31, help="rounds (medians)")
    p.add_argument("--ikes", default="50,200", help="comma-separated IKE_SA counts ('' for none)")
    p.add_argument("--children", type=int, default=1, help="CHILD_SAs per IKE_SA")
    p.add_argument(
        "--peers", default="1000,10000", help="comma-separated WireGuard peer counts ('' for none)"
    )
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_readonly: needs root (network namespaces)", file=sys.stderr)
        return 2
    print("# raw read and scrape: direct -> through the agent's read-only socket (medians)", flush=True)
    for n in (int(x) for x in args.ikes.split(",") if x):
        ipsec(n, args.children, args.repeat)
    for n in (int(x) for x in args.peers.split(",") if x):
        wireguard(n, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
