"""Benchmark: exporter scrape latency and RSS against live daemons, next to the raw floor of the same run.

* IPsec: a lab charon pair with IKES IKE_SAs x CHILDREN CHILD_SAs (default 100 x 10 = 1,000); the floor
  is one raw ``list-sas`` read off the VICI socket (request out, every byte of the answer in, no decoding).
* WireGuard: a wireguard-go interface with 0, 1,000 and 10,000 peers; the floor is one raw UAPI ``get=1``.
  The 0-peer row is the fixed cost of a scrape (HTTP, the UAPI exchange, the daemon-level series): what
  no parser, however fast, takes out of the 1,000-peer case.

Each scrape is a real HTTP GET /metrics against ``python -m exporter`` running as its own process (so
its RSS is the exporter's alone: VmHWM, the peak). Needs root (network namespaces). Prints a table; the
numbers go to docs/exporter.md.

    .venv/bin/python bench/bench_exporter.py [--repeat 30] [--ikes 100] [--children 10] [--peers 0,1000,10000]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwkit.vici import ViciSession, wire
from lab import ports
from lab.peers import psk_conn
from lab.wait import WaitTimeout, wait_for, wait_for_async
from lab.world import SERVICE_CIDR, Lab

REPO = Path(__file__).resolve().parents[1]
PSK = "bench-psk-only"  # bench-only value


_BUF = memoryview(bytearray(64 << 20))
"""One receive buffer for every read in this process: the floor and the scrape are read the same way
(``recv_into``, no per-chunk allocation), so neither pays the client's own copying (at 4 MB, a
``recv``-and-join client spent ~7 ms of its own here, more than the exporter's rendering)."""


def recv_until(s: socket.socket, done: Callable[[int], bool], start: int = 0) -> int:
    """Read into ``_BUF`` from ``start`` until ``done(end)`` or the peer closes; the end offset."""
    n = start
    while not done(n):
        k = s.recv_into(_BUF[n:])
        if not k:
            break
        n += k
    return n


OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def http_scrape(port: int, accept: str = "text/plain;version=0.0.4") -> int:
    """One GET /metrics, read into ``_BUF`` (the timed path: no copy of the body); the body's length."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n".encode())
        n = recv_until(s, lambda n: False)  # Connection: close ends the body
    head = bytes(_BUF[: min(n, 4096)])
    end = head.find(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200") or end < 0:
        raise RuntimeError(head[:200].decode(errors="replace"))
    return n - end - 4


def http_get(port: int, accept: str = "text/plain;version=0.0.4") -> bytes:
    """One GET /metrics: the body."""
    size = http_scrape(port, accept)
    head = bytes(_BUF[:4096])
    start = head.find(b"\r\n\r\n") + 4
    return bytes(_BUF[start : start + size])


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def paired(floor: Callable[[], Any], scrape: Callable[[], Any], repeat: int) -> tuple[float, float, Any, Any]:
    """Alternate one raw read and one scrape per round, so both see the same machine load (this machine
    is shared with other test runs); medians of each."""
    fts, sts, fr, sr = [], [], None, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        fr = floor()
        t1 = time.perf_counter()
        sr = scrape()
        t2 = time.perf_counter()
        fts.append(t1 - t0)
        sts.append(t2 - t1)
    return statistics.median(fts), statistics.median(sts), fr, sr


def raw_list_sas(path: Path) -> int:
    """Register list-sa, send list-sas, read frames (length prefix only) until the response: bytes read."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(wire.register("list-sa"))
        have, pos = 0, 0  # bytes in _BUF; start of the next frame

        def frame() -> int:
            nonlocal have, pos
            have = recv_until(s, lambda n: n >= pos + 4, have)
            (size,) = struct.unpack_from("!I", _BUF, pos)
            have = recv_until(s, lambda n: n >= pos + 4 + size, have)
            if have < pos + 4 + size:
                raise RuntimeError("closed")
            kind = _BUF[pos + 4]
            pos += 4 + size
            return kind

        frame()  # EVENT_CONFIRM
        s.sendall(wire.request("list-sas"))
        while frame() != wire.CMD_RESPONSE:
            pass
        return pos


def raw_uapi_get(path: Path) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(b"get=1\n\n")
        return recv_until(s, lambda n: n >= 2 and _BUF[n - 2] == _BUF[n - 1] == 10)  # ends "\n\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process used so far (/proc/PID/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def series(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


class ExporterProcess:
    """``python -m exporter`` at log level WARNING (its port announcement is INFO, so the port is picked
    here and the start retried on a new one when another process took it first: ``lab.ports``)."""

    def __init__(self, *args: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-exporter-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes]
        self.port = ports.start_on_free_port(lambda port: self._start(port, args), what="the exporter")

    def _start(self, port: int, args: tuple[str, ...]) -> int:
        since = os.fstat(self.log.fileno()).st_size
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "--listen",
                f"127.0.0.1:{port}",
                "--log-level",
                "WARNING",
                *args,
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=self.log,
        )
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:  # exited: fails at once, as PortTaken when its port was taken
                said = Path(self.log.name).read_bytes()[since:].decode(errors="replace")
                if ports.address_in_use(said):
                    raise ports.PortTaken(said.strip()[-300:])
                raise RuntimeError(f"exporter did not start; see {self.log.name}")
            http_get(port)
            return True

        try:
            wait_for(answers, 20, f"the exporter to answer on port {port}", interval=0.1, ignoring=(OSError,))
        except WaitTimeout as e:
            raise RuntimeError(f"exporter did not start; see {self.log.name}") from e
        return port

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        os.unlink(self.log.name)


def report(
    label: str, floor: float, median: float, cpu: float, body: bytes, pid: int, extra: str = ""
) -> dict[str, Any]:
    rss, hwm = rss_mb(pid)
    row: dict[str, Any] = {
        "case": label,
        "floor_ms": floor * 1000,
        "scrape_ms": median * 1000,
        "ratio": median / floor,
        "cpu_ms": cpu * 1000,
        "series": series(body),
        "bytes": len(body),
        "rss_mb": rss,
        "peak_rss_mb": hwm,
    }
    print(
        f"{label:<24} floor {row['floor_ms']:7.1f} ms  scrape {row['scrape_ms']:7.1f} ms  "
        f"x{row['ratio']:.2f}  cpu {row['cpu_ms']:5.1f} ms/scrape  "
        f"series {row['series']:>6}  {row['bytes'] / 1e6:5.2f} MB  "
        f"RSS {rss:5.1f} MB (peak {hwm:5.1f}) {extra}",
        flush=True,
    )
    return row


async def setup_ipsec(lab: Lab, ikes: int, children: int) -> Path:
    site = lab.add_site()
    addrs = [f"{ipaddress.ip_address('10.200.0.0') + i + 1}/32" for i in range(ikes * children)]
    cmds = "".join(f"addr add {a} dev lo\n" for a in addrs)
    await anyio.run_process(["ip", "-n", site.ns, "-batch", "-"], input=cmds.encode())
    g, c = lab.start_charon(lab.gw), lab.start_charon(site)
    async with (
        await ViciSession.connect(g.vici_socket, timeout=60) as gv,
        await ViciSession.connect(c.vici_socket, timeout=60) as sv,
    ):
        for i in range(ikes):
            gid, sid = f"gw-{i}.bench", f"s-{i}.bench"
            for v, me, peer in ((gv, gid, sid), (sv, sid, gid)):
                await v.call("load-shared", {"id": f"k{i}", "type": "IKE", "data": PSK, "owners": [me, peer]})
            kids = addrs[i * children : (i + 1) * children]

            def conn(
                name: str,
                local: str,
                remote: str,
                lid: str,
                rid: str,
                gw_side: bool,
                i: int = i,
                kids: list[str] = kids,
            ) -> dict[str, Any]:
                return psk_conn(
                    name, local_addr=local, remote_addr=remote, local_id=lid, remote_id=rid,
                    children={
                        f"t{i}-{j}": ([SERVICE_CIDR], [a]) if gw_side else ([a], [SERVICE_CIDR])
                        for j, a in enumerate(kids)
                    },
                    proposals="aes128-sha256-modp2048", esp="aes128gcm16",
                )  # fmt: skip

            await gv.call("load-conn", conn(f"t{i}", lab.gw.addresses[0], site.addresses[0], gid, sid, True))
            await sv.call(
                "load-conn", conn(f"gw{i}", site.addresses[0], lab.gw.addresses[0], sid, gid, False)
            )
        for i in range(ikes):
            await gv.stream(
                "initiate", {"child": f"t{i}-0", "ike": f"t{i}", "timeout": "10000"}, "control-log"
            )
            for j in range(1, children):
                await gv.stream(
                    "initiate",
                    {"child": f"t{i}-{j}", "ike": f"t{i}", "timeout": "-1"},
                    "control-log",
                    check=False,
                )
        want = ikes * children
        got = 0

        async def installed() -> bool:
            nonlocal got
            events, _ = await gv.stream("list-sas", {}, "list-sa")
            got = sum(
                1
                for e in events
                for sa in e.values()
                for ch in sa["child-sas"].values()
                if ch["state"] == "INSTALLED"
            )
            return got >= want

        try:
            await wait_for_async(installed, 300, f"{want} CHILD_SAs installed", interval=1)
        except WaitTimeout as e:
            raise RuntimeError(f"only {got}/{want} CHILD_SAs installed") from e
    return g.vici_socket


def setup_wireguard(lab: Lab, peers: int, name: str) -> tuple[Path, Path]:
    wgd = lab.start_wireguard(lab.gw, name)
    lines = ["set=1", "private_key=" + os.urandom(32).hex(), "listen_port=0"]
    for i in range(peers):
        lines += [
            "public_key=" + os.urandom(32).hex(),
            f"allowed_ip={ipaddress.ip_address('10.128.0.0') + i}/32",
            f"endpoint=192.0.2.{1 + i % 200}:{20000 + i % 30000}",
        ]
    payload = ("\n".join(lines) + "\n\n").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(wgd.uapi_socket))
        s.sendall(payload)
        reply = b""
        while not reply.endswith(b"\n\n"):
            reply += s.recv(65536)
    if b"errno=0" not in reply:
        raise RuntimeError(f"uapi set failed: {reply!r}")
    return wgd.uapi_dir, wgd.uapi_socket


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=30, help="scrapes and raw reads per case (median)")
    p.add_argument("--ikes", type=int, default=100)
    p.add_argument("--children", type=int, default=10)
    p.add_argument("--peers", default="0,1000,10000", help="comma-separated WireGuard peer counts")
    p.add_argument("--skip-ipsec", action="store_true")
    p.add_argument("--skip-wireguard", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_exporter: needs root (network namespaces)", file=sys.stderr)
        return 2
    rows = []
    with Lab() as lab:
        if not args.skip_ipsec:
            t0 = time.monotonic()
            vici = anyio.run(setup_ipsec, lab, args.ikes, args.children)
            print(
                f"# {args.ikes} IKE_SAs x {args.children} CHILD_SAs up in {time.monotonic() - t0:.1f}s",
                flush=True,
            )
            exp = ExporterProcess("--vici-socket", str(vici))
            try:
                http_get(exp.port)
                cpu0 = cpu_seconds(exp.proc.pid)
                floor, median, nbytes, _ = paired(
                    lambda: raw_list_sas(vici), lambda: http_scrape(exp.port), args.repeat
                )
                cpu = (cpu_seconds(exp.proc.pid) - cpu0) / args.repeat
                om_median, _ = timed(lambda: http_scrape(exp.port, OPENMETRICS), args.repeat)
                body = http_get(exp.port)
                rows.append(
                    report(
                        f"ipsec {args.ikes}x{args.children}",
                        floor,
                        median,
                        cpu,
                        body,
                        exp.proc.pid,
                        f"(list-sas {nbytes / 1e3:.0f} kB; OpenMetrics {om_median * 1000:.1f} ms)",
                    )
                )
            finally:
                exp.stop()
        if not args.skip_wireguard:
            for n, peers in enumerate(int(x) for x in args.peers.split(",")):
                name = f"wgb{n}"
                uapi_dir, sock = setup_wireguard(lab, peers, name)
                exp = ExporterProcess("--wireguard-interface", name, "--wireguard-uapi-dir", str(uapi_dir))
                try:
                    http_get(exp.port)
                    cpu0 = cpu_seconds(exp.proc.pid)
                    floor, median, nbytes, _ = paired(
                        lambda: raw_uapi_get(sock),  # noqa: B023
                        lambda: http_scrape(exp.port),  # noqa: B023
                        args.repeat,
                    )
                    cpu = (cpu_seconds(exp.proc.pid) - cpu0) / args.repeat
                    om_median, _ = timed(lambda: http_scrape(exp.port, OPENMETRICS), args.repeat)  # noqa: B023
                    body = http_get(exp.port)
                    rows.append(
                        report(
                            f"wireguard {peers} peers",
                            floor,
                            median,
                            cpu,
                            body,
                            exp.proc.pid,
                            f"(UAPI {nbytes / 1e6:.2f} MB; OpenMetrics {om_median * 1000:.1f} ms)",
                        )
                    )
                finally:
                    exp.stop()
                lab.gw.wireguard[name].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
