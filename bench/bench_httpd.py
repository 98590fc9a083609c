"""Benchmark: /healthz latency of the project's HTTP servers while slow clients hold connections open.

    .venv/bin/python bench/bench_httpd.py [--slow 0,100,500,1500] [--requests 200] [--tree DIR]
                                         [--connections N] [--server gwkit.httpd|exporter.http]

The servers: ``gwkit.httpd`` (the agent's probes, the controller's /healthz, /readyz, /metrics) and
``exporter.http`` (the exporter's), each answering /healthz with ``ok``. Three processes per run:

* the server, from this checkout or from ``--tree DIR`` (another checkout, e.g.
  ``git archive <commit> | tar -x -C DIR``, for before/after), with its descriptor soft limit set to 1024,
  a common container default (the servers raise it for their cap); ``--connections`` sets the cap
  (trees from before the cap have none);
* the attacker, which holds N connections open: half send nothing, half a partial request head, none
  reads; whenever the server closes one, the attacker opens another at once (as fast as it can);
* the prober (this process): GET /healthz one after another, each with a 1 s timeout (the kubelet's
  default ``timeoutSeconds``), once the attacker has N connections open.

Prints p50/p99 latency of the answered probes and how many failed (timeout, reset, refused, not 200),
and, once the attacker is gone, how soon the server answers again (or that it died). Numbers go to
docs/agent.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the lab's helpers

from lab.wait import WaitTimeout, wait_for

ROOT = Path(__file__).resolve().parents[1]

SERVER = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
kind, cap = sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import anyio

class Started:
    def started(self, port=None):
        print(port, flush=True)

async def main():
    if kind == "gwkit.httpd":
        from gwkit import httpd
        async def answer(path):
            return (200, "text/plain", b"ok\n") if path == "/healthz" else (404, "text/plain", b"no\n")
        kw = {"limits": httpd.Limits(connections=cap)} if cap else {}
        await httpd.serve("127.0.0.1:0", answer, task_status=Started(), **kw)
    else:
        from exporter.http import Response, serve
        async def answer(method, path, headers):
            return Response(200 if path == "/healthz" else 404, "text/plain", b"ok\n")
        if cap:
            from dataclasses import replace
            from exporter.http import LIMITS
            kw = {"limits": replace(LIMITS, connections=cap, replies=min(cap, LIMITS.replies))}
        else:
            kw = {}
        await serve("127.0.0.1", 0, answer, task_status=Started(), **kw)

try:
    anyio.run(main)
except BaseException as exc:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    print(f"server died: {exc!r}", file=sys.stderr, flush=True)
    sys.exit(1)
"""

ATTACKER = r"""
import resource, select, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
poll = select.poll()
conns = {}
opened = 0
def open_one(i):
    global opened
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    if i % 2:
        try:
            s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        except OSError:
            pass
    conns[s.fileno()] = (s, i)
    poll.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)  # never POLLIN: it never reads
    opened += 1
for i in range(n):
    open_one(i)
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    for fd, _ in poll.poll(100):
        s, i = conns.pop(fd)
        poll.unregister(fd)
        s.close()
        open_one(i)
print(opened, flush=True)
"""


def probe(port: int) -> float | str:
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.settimeout(max(0.001, 1.0 - (time.perf_counter() - t0)))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
    if not data.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")) or not data.endswith(b"ok\n"):
        return data.split(b"\r\n", 1)[0].decode(errors="replace") or "empty"
    return time.perf_counter() - t0


def run(tree: Path, kind: str, slow: int, requests: int, cap: int) -> dict[str, object]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(tree), kind, str(cap)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stderr is not None
    port = int(server.stdout.readline())
    attacker = None
    try:
        if slow:
            attacker = subprocess.Popen(
                [sys.executable, "-c", ATTACKER, str(port), str(slow), "3600"],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert attacker.stdout is not None
            assert attacker.stdout.readline().strip() == "ready"
            time.sleep(1.0)
        results = [probe(port) for _ in range(requests)]
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait()
    # After the flood: the first /healthz answered within 10 s, or the server is gone.
    t0 = time.perf_counter()

    def healthy() -> float | str | None:
        if server.poll() is not None:
            return "the server died"  # ends the wait: it will not recover
        return time.perf_counter() - t0 if isinstance(probe(port), float) else None

    try:
        got = wait_for(healthy, 10, "a /healthz answer after the flood", interval=0.05)
    except WaitTimeout:
        got = None
    recovered = got if isinstance(got, float) else None
    server.kill()
    _, err = server.communicate()
    ok = sorted(r for r in results if isinstance(r, float))
    failed: dict[str, int] = {}
    for r in results:
        if isinstance(r, str):
            failed[r] = failed.get(r, 0) + 1
    died = next((line for line in err.splitlines() if line.startswith("server died")), "")
    return {
        "server": kind,
        "slow": slow,
        "p50_ms": statistics.median(ok) * 1000 if ok else None,
        "p99_ms": ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000 if ok else None,
        "answered": len(ok),
        "failed": failed,
        "recovered_s": recovered,
        "died": died,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", default="0,100,500,1500")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose servers to run")
    ap.add_argument("--connections", type=int, default=0, help="the cap, instead of the server's default")
    ap.add_argument("--server", action="append", choices=["gwkit.httpd", "exporter.http"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print(f"tree={args.tree} cpus={os.cpu_count()} cap={args.connections or 'default'}", file=sys.stderr)
    print("| server | slow clients | p50 | p99 | failed / probes | after the flood |")
    print("|---|---:|---:|---:|---:|---|")
    for kind in args.server or ["gwkit.httpd", "exporter.http"]:
        for slow in (int(n) for n in args.slow.split(",")):
            r = run(args.tree, kind, slow, args.requests, args.connections)
            if args.json:
                print(json.dumps(r), file=sys.stderr)
            p50 = f"{r['p50_ms']:.2f} ms" if r["p50_ms"] is not None else "-"
            p99 = f"{r['p99_ms']:.2f} ms" if r["p99_ms"] is not None else "-"
            failed = ", ".join(f"{k} {v}" for k, v in sorted(r["failed"].items())) or "0"  # type: ignore[attr-defined]
            if r["recovered_s"] is not None:
                state = f"answers {r['recovered_s']:.2f} s after"
            else:
                state = f"dead: {r['died'] or 'no answer in 10 s'}"
            print(f"| {kind} | {slow:,} | {p50} | {p99} | {failed} / {args.requests} | {state} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
