"""End-to-end timings of the gateway as the e2e tests run it (root; lab/kubelet/world.py): the real controller
as a process against the Kubernetes API emulator, the lab kubelet running the gateway pod (process
containers by default, ``--runtime podman`` for the built images), live charon daemons at two remote sites
(one with two subnets), traffic through the tunnels.

1. ``kubectl apply`` of the gateway and its peers until every tunnel is Established on the CR (a fresh
   world each round: controller, Deployment, pod, init-nat, charon, the agent's push and initiate).
2. A grant revoked (``kubectl patch``) until the established flow under it is cut (a long-lived TCP
   connection echoing every 50 ms: the send time of the first echo that did not come back), restored
   between rounds; the kubelet's volume refresh is 60 s away throughout.
3. A peer added (``kubectl apply`` of a third VPNPeer, its site ready) until its tunnel is Established;
   removed between rounds.
4. charon's container killed (SIGKILL) until the kubelet restarted it, the agent re-pushed and every
   tunnel is Established again (the CR's ``establishedAt`` after the kill).

Usage: ``.venv/bin/python bench/bench_e2e.py [--rounds N] [--runtime process|podman] [--only PART]``;
prints ``bench.e2e ...`` lines and a table (docs/e2e.md). Exit 0, 1 when a round fails, 2 bad usage.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gwkit.logs import setup_logging  # noqa: E402
from gwkit.vici import ViciUnavailable  # noqa: E402
from lab.kubelet.world import E2EWorld, secret_doc  # noqa: E402
from lab.world import Host  # noqa: E402
from tests.examples import example_docs  # noqa: E402

NS = "tenant-acme"
LANS = {"s1": ["203.0.113.0/28", "198.19.1.16/28"], "s2": ["203.0.113.16/28"], "s3": ["203.0.113.32/28"]}


def stats(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"median {statistics.median(xs):.3f} s, min {min(xs):.3f}, max {max(xs):.3f} (n={len(xs)})"


def up(w: E2EWorld) -> tuple[dict[str, Host], float]:
    sites = {n: w.add_ipsec_site(LANS[n]) for n in ("s1", "s2")}
    for name, site in sites.items():
        psk = w.psk + "-s1" if name == "s1" else w.psk
        w.configure_ipsec_site(site, psk=psk, site_id=f"{name}.lab.example")
    docs = example_docs("ipsec.yaml")
    for p in docs[1:]:
        p["spec"]["endpoint"] = sites[p["metadata"]["name"]].addresses[0]
        p["spec"]["ipsec"]["remoteSubnets"] = sites[p["metadata"]["name"]].lans
    t0 = time.monotonic()
    w.apply(docs)
    w.c.apply([secret_doc(NS, "acme-psk", {"psk": w.psk}), secret_doc(NS, "s1-psk", {"psk": w.psk + "-s1"})])
    w.wait(lambda: w.established(["s1", "s2"]), 60, "every tunnel Established")
    return sites, time.monotonic() - t0


def patch_grants(w: E2EWorld, peer: str, exposures: list[str]) -> None:
    body = json.dumps({"spec": {"authorization": {"exposures": exposures}}})
    w.kubectl("patch", "vpnpeer", peer, "-n", NS, "--type=merge", "-p", body)


def revocations(w: E2EWorld, sites: dict[str, Host], rounds: int) -> list[float]:
    out = []
    db = w.vip("db")
    for i in range(rounds):
        client = w.long_client(sites["s1"], db, 5432, f"bench-cut-{i}")
        w.wait(client.alive, 15, "the long-lived flow")
        time.sleep(0.3)
        t_edit = time.time()
        patch_grants(w, "s1", ["web"])
        w.wait(client.cut_at, 15, "the flow cut")
        at = client.cut_at()
        assert at is not None
        out.append(at - t_edit)
        print(f"bench.e2e part=revoke round={i} seconds={at - t_edit:.3f}", flush=True)
        patch_grants(w, "s1", ["web", "db"])
        w.wait(lambda: w.reaches(sites["s1"], db, 5432), 30, "the grant restored")
    return out


def additions(w: E2EWorld, rounds: int) -> list[float]:
    out = []
    s3 = w.add_ipsec_site(LANS["s3"])
    w.configure_ipsec_site(s3, psk=w.psk, site_id="s3.lab.example")
    peer = copy.deepcopy(example_docs("ipsec.yaml")[2])
    peer["metadata"]["name"] = "s3"
    peer["spec"].update(
        {"endpoint": s3.addresses[0], "ipsec": {"id": "s3.lab.example", "remoteSubnets": s3.lans}}
    )
    for i in range(rounds):
        t0 = time.monotonic()
        w.apply([peer])
        w.wait(lambda: w.established(["s1", "s2", "s3"]), 60, "the added peer Established")
        out.append(time.monotonic() - t0)
        print(f"bench.e2e part=add round={i} seconds={out[-1]:.3f}", flush=True)
        w.kubectl("delete", "vpnpeer", "s3", "-n", NS)
        w.wait(lambda: "s3" not in w.tunnels(), 30, "the peer removed")
        time.sleep(0.5)
    return out


def sas_up(w: E2EWorld) -> bool:
    """Both sites' IKE_SAs ESTABLISHED on the gateway's (new) charon, over its VICI socket."""
    try:
        sas = w.gateway_sas()
    except (ViciUnavailable, OSError):
        return False
    return {n for n, sa in sas.items() if sa.get("state") == "ESTABLISHED"} == {"s1", "s2"}


def kill_once(w: E2EWorld) -> tuple[float, float]:
    """(seconds until charon's IKE_SAs are up again, seconds until the CR says Established again)."""
    pod = w.pod()
    assert pod is not None
    time.sleep(2.0)  # the CR's establishedAt (whole seconds) is then older than the kill's second
    killed_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time()))
    t0 = time.monotonic()
    assert w.k.kill(NS, pod.name, "charon")

    def back() -> bool:
        t = w.tunnels()
        return w.established(["s1", "s2"]) and all(
            (x.get("establishedAt") or "") >= killed_at for x in t.values()
        )

    w.wait(lambda: sas_up(w), 120, "the IKE_SAs up on the new charon", interval=0.01)
    sas = time.monotonic() - t0
    w.wait(back, 120, "Established again on the CR after the kill")
    return sas, time.monotonic() - t0


def kills(tmp: Path, runtime: str, rounds: int) -> dict[str, list[float]]:
    """A fresh pod per round (the first kill: restarted at once), then, in the last pod, kills in a row:
    the kubelet's CrashLoopBackOff (10 s, 20 s, 40 s ... before each further restart)."""
    out: dict[str, list[float]] = {"kill-sas": [], "kill": [], "kill-again": []}
    for i in range(rounds):
        with E2EWorld(tmp / f"kill-{i}", runtime=runtime) as w:
            up(w)
            sas, cr = kill_once(w)
            out["kill-sas"].append(sas)
            out["kill"].append(cr)
            print(f"bench.e2e part=kill round={i} sas_seconds={sas:.3f} cr_seconds={cr:.3f}", flush=True)
            if i == rounds - 1:
                for j in range(3):
                    out["kill-again"].append(kill_once(w)[1])
                    print(
                        f"bench.e2e part=kill-again round={j} seconds={out['kill-again'][-1]:.3f}", flush=True
                    )
    return out


def run(rounds: int, runtime: str, only: str | None) -> dict[str, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    try:
        return _run(tmp, rounds, runtime, only)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(tmp: Path, rounds: int, runtime: str, only: str | None) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}

    def want(part: str) -> bool:
        return only is None or only == part

    if want("apply"):
        results["apply"] = []
        for i in range(rounds):
            with E2EWorld(tmp / f"apply-{i}", runtime=runtime) as w:
                _, seconds = up(w)
            results["apply"].append(seconds)
            print(f"bench.e2e part=apply round={i} seconds={seconds:.3f}", flush=True)
    if want("revoke") or want("add"):
        with E2EWorld(tmp / "steady", runtime=runtime) as w:
            sites, _ = up(w)
            w.wait(lambda: w.reaches(sites["s1"], w.vip("db"), 5432), 30, "traffic")
            if want("revoke"):
                results["revoke"] = revocations(w, sites, max(rounds, 10))
            if want("add"):
                results["add"] = additions(w, rounds)
    if want("kill"):
        results.update(kills(tmp, runtime, rounds))
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds per part (revocation: at least 10)")
    p.add_argument("--runtime", choices=("process", "podman"), default="process")
    p.add_argument("--only", choices=("apply", "revoke", "add", "kill"))
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    if os.geteuid() != 0:
        print("bench.e2e.failed error='needs root (network namespaces, charon)'", file=sys.stderr)
        return 1
    setup_logging("WARNING")
    try:
        results = run(args.rounds, args.runtime, args.only)
    except AssertionError as exc:
        print(f"bench.e2e.failed error={str(exc).splitlines()[0]!r}", file=sys.stderr)
        return 1
    print(
        f"\nkernel {os.uname().release}, {os.cpu_count()} cpus, runtime={args.runtime}, rounds={args.rounds}"
    )
    names = {
        "apply": "CR applied -> every tunnel Established",
        "revoke": "grant revoked -> established flow cut",
        "add": "peer added -> its tunnel Established",
        "kill-sas": "charon killed -> its IKE_SAs up again",
        "kill": "charon killed -> Established again on the CR",
        "kill-again": "  killed again 2 s after (CrashLoopBackOff)",
    }
    for key, xs in results.items():
        print(f"  {names[key]:42s} {stats(xs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
