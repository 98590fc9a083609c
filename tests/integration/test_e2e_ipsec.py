"""End to end, IPsec: ``kubectl apply`` of a VPNGateway and its VPNPeers, the real controller (a process)
against the Kubernetes API emulator, the lab kubelet running the gateway pod the controller's Deployment
describes (its containers as processes from the project's environment), live charon daemons at remote
sites configured independently (hand-written VICI, as a tenant's firewall), traffic through the tunnels.

Proved here: CR -> tunnels -> status (every tunnel Established on the CR, ``kubectl get vpngateways``
Ready); grants decide who reaches which exposure; a revoked grant cuts the established flow through the
API path (controller, the agent's plan follower, init-nat, conntrack) while the kubelet's volume refresh
is a minute away; a peer added without a pod restart or another tunnel renegotiated; charon killed,
restarted by the kubelet, tunnels back; the gateway deleted, nothing left; the pod's eth0 egress is
exactly what its NetworkPolicy allows; the pod's identity asking for more than its Role is refused (403).

Times are printed (``e2e.measured ...``), never asserted beyond generous timeouts: bench/bench_e2e.py
measures them (docs/e2e.md).
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gwkit.vici import ViciError, ViciUnavailable
from lab import netns
from lab.cluster import home_of
from lab.kubelet import netpol
from lab.kubelet.world import DB_ADDR, DNS_ADDRESS, VPN, E2EWorld, secret_doc
from lab.world import Host
from tests.examples import example_docs

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

NS = "tenant-acme"
HOME, HOME_NS = home_of("acme", NS)
"""The gateway's pod and its objects: in the operator's gateway namespace."""
GW_ID = "gw.lab.example"
LANS = {
    "s1": ["203.0.113.0/28", "198.19.1.16/28"],
    "s2": ["203.0.113.16/28"],
    "laptop": ["203.0.113.48/28"],
    "s3": ["203.0.113.32/28"],
}
LAB_PODS = {
    DNS_ADDRESS: netpol.PodIdentity({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
}


def measured(what: str, seconds: float) -> None:
    print(f"e2e.measured what={what} seconds={seconds:.3f}")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[E2EWorld]:
    with E2EWorld(tmp_path) as w:
        run_id = w.k.run_id
        yield w
    left = [n for n in netns.list_namespaces() if n.startswith(run_id)]
    assert left == [], f"namespaces left behind: {left}"


def docs(
    world: E2EWorld, sites: dict[str, Host], *, road_warrior: bool = False, db_host: bool = False
) -> list[dict[str, Any]]:
    """The example gateway with its peers pointed at this world's sites; a road warrior ``laptop``."""
    out = example_docs("ipsec.yaml")
    if db_host:  # the target by name: init-nat resolves it through the cluster's DNS
        world.k.set_dns("db.fabric.example", DB_ADDR)
        out[0]["spec"]["exposures"][1]["target"] = {"host": "db.fabric.example"}
    peers = {p["metadata"]["name"]: p for p in out[1:]}
    for name, site in sites.items():
        if name in peers:
            peers[name]["spec"]["endpoint"] = site.addresses[0]
            peers[name]["spec"]["ipsec"]["remoteSubnets"] = site.lans
    if road_warrior:
        rw = copy.deepcopy(out[2])
        rw["metadata"]["name"] = "laptop"
        rw["spec"] = {
            "gatewayRef": {"name": "acme"},
            "type": "roadWarrior",
            "ipsec": {"id": "laptop.lab.example", "remoteSubnets": LANS["laptop"]},
            "authorization": {"exposures": ["web"]},
        }
        out.append(rw)
    return out


def psk_of(world: E2EWorld, peer: str) -> str:
    return world.psk + "-s1" if peer == "s1" else world.psk


def bring_up(
    world: E2EWorld,
    names: tuple[str, ...] = ("s1", "s2"),
    *,
    road_warrior: bool = False,
    db_host: bool = False,
) -> tuple[dict[str, Host], float]:
    """Sites, then ``kubectl apply``, the Secrets, the sites' own configuration; every tunnel Established.
    Returns the sites and the seconds from the apply to all Established."""
    sites = {n: world.add_ipsec_site(LANS[n]) for n in names}
    if road_warrior:
        sites["laptop"] = world.add_ipsec_site(LANS["laptop"])
    for name, site in sites.items():
        world.configure_ipsec_site(site, psk=psk_of(world, name), site_id=f"{name}.lab.example")
    t0 = time.monotonic()
    out = world.apply(docs(world, sites, road_warrior=road_warrior, db_host=db_host))
    assert "vpngateway.vpn.bnerd.net/acme created" in out, out
    world.c.apply(
        [secret_doc(NS, "acme-psk", {"psk": world.psk}), secret_doc(NS, "s1-psk", {"psk": world.psk + "-s1"})]
    )
    if road_warrior:
        world.wait(lambda: initiated(world, sites["laptop"]), 30, "the road warrior's own initiate")
    world.wait(lambda: world.established(list(sites)), 30, "every tunnel Established on the CR")
    return sites, time.monotonic() - t0


def initiated(world: E2EWorld, site: Host) -> bool:
    """The road warrior dials in (its own charon initiates, as a laptop's client does)."""
    import asyncio

    from gwkit.vici import ViciSession

    async def go() -> bool:
        assert site.charon is not None
        async with await ViciSession.connect(site.charon.vici_socket) as v:
            try:
                await v.stream("initiate", {"child": "gw-0", "timeout": "2000"}, "control-log")
            except ViciError:
                return False
        return True

    return asyncio.run(go())


def ready_row(world: E2EWorld) -> str | None:
    table = world.kubectl("get", "vpngateways", "-n", NS).stdout
    rows = [line.split() for line in table.splitlines()[1:]]
    return table if rows and rows[0][0] == "acme" and rows[0][4] == "True" else None


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def exporter_metrics(world: E2EWorld, *up: str, name: str = "acme", ns: str = NS) -> Samples | None:
    """The pod's exporter as it runs: 65532 with no capabilities, with neither the live directory (the
    Secrets) nor charon's or wireguard-go's socket in its view, only the agent's read-only directory; its
    /metrics scraped as Prometheus does (pod IP), once every series ``up`` (``name{l="v",...}``) is 1."""
    from prometheus_client.parser import text_string_to_metric_families

    worker, pod = world.pod(name, ns), world.pod_object(name, ns)
    assert worker is not None and pod is not None
    pid = worker.instances["exporter"].running.pid
    st = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert st["Uid"].split() == ["65532"] * 4 and int(st["CapEff"], 16) == int(st["CapBnd"], 16) == 0
    root = Path(f"/proc/{pid}/root")
    assert (root / "run/vpngw-readonly/plan.json").exists()
    for hidden in ("run/vpngw", "run/charon", "var/run/charon", "var/run/wireguard"):
        assert not (root / hidden).exists(), f"the exporter sees /{hidden}"
    ports = [p for c in worker.spec["containers"] for p in c.get("ports", []) if p["name"] == "metrics"]
    url = f"http://{pod['status']['podIP']}:{ports[0]['containerPort']}/metrics"
    res = world.lab.gw.run("curl", "-s", "-m", "5", url, check=False, timeout=10)
    text = res.stdout.decode(errors="replace")
    if world.psk in text:
        raise AssertionError("a PSK in the metrics")
    samples: Samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    keys = [
        (n, tuple(sorted(re.findall(r'(\w+)="([^"]*)"', rest))))
        for n, _, rest in (u.partition("{") for u in up)
    ]
    return samples if all(samples.get(k) == 1 for k in keys) else None


def gateway_sas(world: E2EWorld) -> dict[str, Any] | None:
    try:
        return world.gateway_sas()
    except (ViciUnavailable, OSError):
        return None


def test_apply_to_every_tunnel_established_and_ready_and_grants_decide_who_reaches_what(
    world: E2EWorld,
) -> None:
    sites, seconds = bring_up(world, road_warrior=True)
    measured("apply_to_established", seconds)
    tunnels = world.tunnels()
    assert set(tunnels) == {"s1", "s2", "laptop"}
    assert [c["state"] for c in tunnels["s1"]["children"]] == ["Established", "Established"], (
        "multi-subnet s1"
    )
    peer = world.wait(
        lambda: (
            ((world.c.get(VPN, "VPNPeer", "s1", NS) or {}).get("status") or {}).get("state") == "Established"
        ),
        15,
        "VPNPeer s1's own status.state Established (the status-agent)",
    )
    assert peer
    table = world.wait(lambda: ready_row(world), 30, "kubectl get vpngateways: Ready")
    assert "node-a" in table and "192.0.2.2" in table, table
    pod = world.pod_object()
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert {c["name"] for c in pod["status"]["containerStatuses"]} == {
        "init-nat-watch",
        "charon",
        "status-agent",
        "exporter",
    }
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    world.wait(
        lambda: exporter_metrics(world, "strongswan_up{}", 'strongswan_tunnel_up{tunnel="s1"}'),
        30,
        "the exporter's metrics through the agent's VICI relay",
    )
    web, db = world.vip("web"), world.vip("db")
    s1, s2, rw = sites["s1"], sites["s2"], sites["laptop"]
    assert world.reaches(s1, web, 80) and world.reaches(s1, db, 5432), "s1 is granted web and db"
    second = str(next(ipaddress.ip_network(s1.lans[1]).hosts()))
    assert world.reaches(s1, web, 80, src=second), "through s1's second child (its second LAN)"
    assert world.reaches(s2, web, 80), "s2 is granted web"
    assert not world.reaches(s2, db, 5432), "s2 is not granted db"
    assert world.reaches(rw, web, 80), "the road warrior is granted web"
    assert not world.reaches(rw, db, 5432), "the road warrior is not granted db"
    worker = world.pod()
    assert worker is not None
    logs = "".join(p.read_text(errors="replace") for p in (worker.dir / "logs").glob("*.log"))
    assert "agent.started" in logs and world.psk not in logs, "the pod's logs never show a PSK"
    forbidden = [
        r for r in world.c.kube.requests(user=f"system:serviceaccount:{HOME_NS}:{HOME}") if r.code == 403
    ]
    assert forbidden == [], [(r.verb, r.path) for r in forbidden]


def test_a_revoked_grant_cuts_the_established_flow_before_the_kubelet_refreshes_the_volume(
    world: E2EWorld,
) -> None:
    sites, _ = bring_up(world)
    web, db = world.vip("web"), world.vip("db")
    cut = world.long_client(sites["s1"], db, 5432, "s1-db")
    kept = world.long_client(sites["s2"], web, 80, "s2-web")
    world.wait(lambda: cut.alive() and kept.alive(), 15, "the long-lived flows")
    pod = world.pod()
    assert pod is not None
    mounted = pod.volume_path("plan") / "plan.json"
    live = pod.volume_path("live") / "plan.json"
    t_edit = time.time()
    world.kubectl(
        "patch",
        "vpnpeer",
        "s1",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"authorization": {"exposures": ["web"]}}}),
    )
    world.wait(cut.cut_at, 10, "the revoked flow cut")
    at = cut.cut_at()
    assert at is not None
    measured("grant_revoked_to_flow_cut", at - t_edit)
    assert kept.alive() and kept.cut_at() is None, "the other grant's flow keeps running"
    assert "s1" in grant_peers(mounted, "db"), "the kubelet's volume still has the grant: it was not the path"
    assert "s1" not in grant_peers(live, "db"), "the live plan the agent follows has it revoked"
    assert not world.reaches(sites["s1"], db, 5432), "and a new connection is refused too"
    assert world.reaches(sites["s1"], web, 80)


def grant_peers(plan_file: Path, exposure: str) -> set[str]:
    import gwplan

    plan = gwplan.loads(plan_file.read_bytes())
    return {g.peer for g in plan.nat.grants if g.exposure == exposure}


def test_adding_a_peer_restarts_nothing_and_keeps_the_other_tunnels_ike_sas(world: E2EWorld) -> None:
    bring_up(world)
    pod = world.pod_object()
    assert pod is not None

    def both() -> dict[str, Any] | None:
        s = gateway_sas(world)
        return s if s is not None and set(s) == {"s1", "s2"} else None

    before = world.wait(both, 10, "the IKE_SAs")
    ids = {name: sa["uniqueid"] for name, sa in before.items()}
    s3 = world.add_ipsec_site(LANS["s3"])
    world.configure_ipsec_site(s3, psk=world.psk, site_id="s3.lab.example")
    peer = copy.deepcopy(example_docs("ipsec.yaml")[2])
    peer["metadata"]["name"] = "s3"
    peer["spec"].update(
        {"endpoint": s3.addresses[0], "ipsec": {"id": "s3.lab.example", "remoteSubnets": s3.lans}}
    )
    t0 = time.monotonic()
    world.apply([peer])
    world.wait(lambda: world.established(["s1", "s2", "s3"]), 30, "the new peer's tunnel Established")
    measured("peer_added_to_established", time.monotonic() - t0)
    after = gateway_sas(world)
    assert after is not None
    assert {n: after[n]["uniqueid"] for n in ("s1", "s2")} == ids, (
        "the other tunnels' IKE_SAs are the same ones"
    )
    now = world.pod_object()
    assert now is not None and now["metadata"]["uid"] == pod["metadata"]["uid"], "the same pod"
    assert [c["restartCount"] for c in now["status"]["containerStatuses"]] == [0, 0, 0, 0]
    assert world.reaches(s3, world.vip("web"), 80), "s3 is granted web (the example's grants for s2)"


def charon_status(world: E2EWorld) -> dict[str, Any] | None:
    pod = world.pod_object()
    for c in (pod or {}).get("status", {}).get("containerStatuses") or []:
        if c["name"] == "charon":
            return dict(c)
    return None


def test_a_killed_charon_container_is_restarted_and_its_tunnels_come_back(world: E2EWorld) -> None:
    sites, _ = bring_up(world)
    pod = world.pod()
    assert pod is not None
    world.wait(lambda: gateway_sas(world), 10, "the IKE_SAs")
    time.sleep(2.0)  # the CR's establishedAt (whole seconds) is then older than the kill's second
    t0, killed_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert world.k.kill(pod.namespace, pod.name, "charon")
    restarted = world.wait(
        lambda: (c := charon_status(world)) and c["restartCount"] == 1 and "running" in c["state"] and c,
        30,
        "the kubelet restarting charon",
    )
    assert restarted["lastState"]["terminated"]["exitCode"] == 137, restarted

    def back() -> bool:
        sas = gateway_sas(world) or {}
        fresh = {n: t.get("establishedAt") or "" for n, t in world.tunnels().items()}
        return (
            {n for n, sa in sas.items() if sa.get("state") == "ESTABLISHED"} == {"s1", "s2"}
            and world.established(["s1", "s2"])
            and all(at >= killed_at for at in fresh.values())
        )

    world.wait(back, 60, "the agent re-pushing to the new charon and the CR's tunnels Established again")
    measured("charon_killed_to_established", time.monotonic() - t0)
    assert world.reaches(sites["s1"], world.vip("web"), 80)
    agent_log = (pod.dir / "logs" / "status-agent-0.log").read_text()
    assert "vici.connected" in agent_log and "cycle=2" in agent_log, "the same agent reconnected"
    assert agent_log.count("conn.loaded name=s1") >= 2, "and pushed its connections to the new charon again"
    others = {c["name"]: c["restartCount"] for c in world.pod_object()["status"]["containerStatuses"]}  # type: ignore[index]
    assert others == {"init-nat-watch": 0, "charon": 1, "status-agent": 0, "exporter": 0}


def test_deleting_the_gateway_stops_the_pod_and_leaves_nothing(world: E2EWorld) -> None:
    bring_up(world)
    pod = world.pod()
    assert pod is not None
    pids = netns.pids_in(pod.netns)
    assert len(pids) >= 4, pids
    world.kubectl("delete", "vpngateway", "acme", "-n", NS, "--wait=false")
    world.wait(lambda: world.c.get(VPN, "VPNGateway", "acme", NS) is None, 60, "the finalizer released")
    world.wait(lambda: not world.c.kube.list("v1", "Pod", HOME_NS), 60, "the pod gone from the API")
    world.wait(
        lambda: pod.name not in {w.name for w in world.k.kubelet.workers.values()}, 30, "the pod stopped"
    )
    assert pod.netns not in netns.list_namespaces(), "the pod's network namespace"
    assert not any(Path(f"/proc/{p}").exists() for p in pids), "the pod's processes"
    links = netns.run(["ip", "-n", world.lab.gw.ns, "-o", "link"]).stdout.decode()
    assert pod.sandbox.veth not in links, "the pod's veth"
    assert "ens7" in links, "NIC2 back on the node (host-device DEL)"
    assert not pod.dir.joinpath("volumes").exists(), "the pod's volumes (tmpfs unmounted)"
    for kind in ("Deployment", "ConfigMap", "ServiceAccount", "Role"):
        api = (
            "apps/v1"
            if kind == "Deployment"
            else ("rbac.authorization.k8s.io/v1" if kind == "Role" else "v1")
        )
        world.wait(functools.partial(collected, world, api, kind), 30, f"the {kind} collected")


@pytest.fixture
def precise_world(tmp_path: Path) -> Iterator[E2EWorld]:
    """The controller told where the API server is (``--apiserver-endpoints``): here, the relay's address."""
    with E2EWorld(tmp_path, controller_args=["--apiserver-endpoints", "10.96.0.1/32:443"]) as w:
        yield w


def rule_triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    return {
        (json.dumps(peer, sort_keys=True), str(p.get("protocol", "TCP")), int(p["port"]))
        for r in rules
        for peer in r.get("to") or [{}]
        for p in r.get("ports") or []
    }


def collected(world: E2EWorld, api: str, kind: str) -> bool:
    """Gone from the gateway namespace (the finalizer deletes them there) and the tenant's (its Role:
    the garbage collector)."""
    return world.c.owned(api, kind, "acme", NS) is None and world.c.get(api, kind, "vpngw-acme", NS) is None


def test_the_pods_eth0_egress_is_exactly_what_its_network_policy_allows(precise_world: E2EWorld) -> None:
    """Observed on the node end of eth0 while the gateway starts, follows its plan, resolves an exposure's
    target by name, carries traffic and has a grant revoked; then checked against the controller's
    NetworkPolicy, rule by rule, and against the policy derived from the observation."""
    world = precise_world
    sites, _ = bring_up(world, db_host=True)
    assert world.reaches(sites["s1"], world.vip("db"), 5432), "the named target, resolved through cluster DNS"
    world.kubectl(
        "patch",
        "vpnpeer",
        "s1",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"authorization": {"exposures": ["web"]}}}),
    )
    world.wait(lambda: not world.reaches(sites["s1"], world.vip("db"), 5432), 10, "the revocation")
    pod = world.pod()
    assert pod is not None and pod.capture is not None
    egress = pod.capture.egress()
    seen = sorted({(f.protocol, f.peer, f.port) for f in egress})
    print("e2e.egress", " ".join(f"{p}/{ip}:{port}" for p, ip, port in seen), "other", pod.capture.other)
    policy = world.c.owned("networking.k8s.io/v1", "NetworkPolicy", "acme", NS)
    assert policy is not None
    used: set[int] = set()
    for proto, ip, port in seen:
        rules = netpol.allowed(policy, proto, ip, port, LAB_PODS)
        assert rules, f"{proto} {ip}:{port} left eth0 but the NetworkPolicy denies it"
        used.update(rules)
    unused = [policy["spec"]["egress"][i] for i in range(len(policy["spec"]["egress"])) if i not in used]
    assert unused == [], f"egress rules the pod never needed: {unused}"
    derived = netpol.derive(seen, LAB_PODS)
    print("e2e.derived_egress", json.dumps(derived))
    assert {("TCP", "10.96.0.1", 443), ("UDP", DNS_ADDRESS, 53)} <= set(seen), seen
    assert all(ip in ("10.96.0.1", DNS_ADDRESS) for _, ip, _ in seen), seen
    have, need = rule_triples(policy["spec"]["egress"]), rule_triples(derived)
    assert need <= have
    dns_peer = json.dumps(policy["spec"]["egress"][0]["to"][0], sort_keys=True)
    assert have - need == {(dns_peer, "TCP", 53)}, (
        "beyond what was seen: only DNS over TCP (truncated answers)"
    )


PROBE = """
import json, sys, httpx
sa, tenant, plan = sys.argv[1:4]
token = open(f"{sa}/token").read().strip()
ns = open(f"{sa}/namespace").read().strip()
auth = {"Authorization": f"Bearer {token}"}
api = httpx.Client(base_url="https://10.96.0.1:443", verify=f"{sa}/ca.crt", headers=auth)
gw = f"/apis/vpn.bnerd.net/v1alpha1/namespaces/{tenant}/vpngateways"
merge = {"Content-Type": "application/merge-patch+json"}
out = {}
def code(key, method, path, **kw):
    out[key] = api.request(method, path, **kw).status_code
code("own-plan", "GET", f"/api/v1/namespaces/{ns}/configmaps/{plan}")
code("other-configmap", "GET", f"/api/v1/namespaces/{ns}/configmaps/unrelated")
code("tenant-configmap", "GET", f"/api/v1/namespaces/{tenant}/configmaps/unrelated")
code("referenced-secret", "GET", f"/api/v1/namespaces/{tenant}/secrets/s1-psk")
code("other-secret", "GET", f"/api/v1/namespaces/{tenant}/secrets/unrelated")
code("list-secrets", "GET", f"/api/v1/namespaces/{tenant}/secrets")
code("own-status", "PATCH", f"{gw}/acme/status", content=b"{}", headers=merge)
code("own-spec", "PATCH", f"{gw}/acme", content=b"{}", headers=merge)
code("other-status", "PATCH", f"{gw}/ghost/status", content=b"{}", headers=merge)
peers = f"/apis/vpn.bnerd.net/v1alpha1/namespaces/{tenant}/vpnpeers"
code("peer-status", "PATCH", f"{peers}/s1/status", content=b"{}", headers=merge)
code("other-peer-status", "PATCH", f"{peers}/ghost/status", content=b"{}", headers=merge)
code("delete-pods", "DELETE", f"/api/v1/namespaces/{ns}/pods/x")
code("tenant-pods", "GET", f"/api/v1/namespaces/{tenant}/pods")
print(json.dumps(out))
"""


def test_the_pods_identity_asking_for_more_than_its_role_is_refused(world: E2EWorld, tmp_path: Path) -> None:
    """From inside the gateway pod's network namespace, with the token and CA the kubelet projected, as the
    agent's in-cluster configuration uses them: what the Role allows answers, everything else is 403."""
    bring_up(world)
    world.c.apply(
        [
            secret_doc(NS, "unrelated", {"x": "y"}),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated", "namespace": NS}},
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "unrelated", "namespace": HOME_NS},
            },
        ]
    )
    pod = world.pod()
    assert pod is not None
    # The token is the status-agent's alone (no kube-api-access volume in the other containers).
    assert not [v for v in pod.volumes.values() if v.name.startswith("kube-api-access-")]
    sa = next(v.path for v in pod.volumes.values() if v.name == "api-token")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    since = world.c.kube.reset_requests()
    res = subprocess.run(
        netns.ns_exec(pod.netns, sys.executable, str(script), str(sa), NS, HOME),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    codes = json.loads(res.stdout)
    assert codes == {
        "own-plan": 200,
        "other-configmap": 403,
        "tenant-configmap": 403,
        "referenced-secret": 200,
        "other-secret": 403,
        "list-secrets": 403,
        "own-status": 200,
        "own-spec": 403,
        "other-status": 403,
        "peer-status": 200,
        "other-peer-status": 403,
        "delete-pods": 403,
        "tenant-pods": 403,
    }, codes
    user = f"system:serviceaccount:{HOME_NS}:{HOME}"
    refused = sorted(r.path for r in world.c.kube.requests(user=user, since=since) if r.code == 403)
    assert len(refused) == 9 and all(r.startswith(("/api/v1/", "/apis/vpn.bnerd.net/")) for r in refused), (
        refused
    )


# --- fail closed per item (docs/security.md): one invalid object never stops a removal -------------------


def peer_doc(world: E2EWorld, sites: dict[str, Host], name: str, **spec: Any) -> dict[str, Any]:
    """The peer ``name`` as bring_up applied it, with ``spec`` fields replaced."""
    doc = next(d for d in docs(world, sites) if d["metadata"]["name"] == name)
    doc["spec"].update(spec)
    return doc


def rendered(world: E2EWorld) -> dict[str, Any]:
    conds = {c["type"]: c for c in (world.gateway().get("status") or {}).get("conditions") or []}
    return dict(conds.get("ConfigRendered") or {})


def test_a_grant_revoked_while_another_peer_turns_invalid_in_the_same_edit_is_cut(world: E2EWorld) -> None:
    """One ``kubectl apply``: s1 loses db, s2 takes s1's subnet (an overlap: s2 is left out). Before, any
    invalid peer kept the whole deployed plan in force, and with it the revoked grant."""
    sites, _ = bring_up(world)
    web, db = world.vip("web"), world.vip("db")
    cut = world.long_client(sites["s1"], db, 5432, "s1-db")
    kept = world.long_client(sites["s1"], web, 80, "s1-web")
    world.wait(lambda: cut.alive() and kept.alive(), 15, "the long-lived flows")
    s1 = peer_doc(world, sites, "s1", authorization={"exposures": ["web"], "reverseExposures": ["printer"]})
    s2 = peer_doc(world, sites, "s2")
    s2["spec"]["ipsec"]["remoteSubnets"] = [LANS["s1"][0]]  # overlaps s1's: s2 is left out
    t_edit = time.time()
    world.apply([s1, s2])
    world.wait(cut.cut_at, 10, "the revoked flow cut")
    at = cut.cut_at()
    assert at is not None
    measured("grant_revoked_beside_an_invalid_peer_to_flow_cut", at - t_edit)
    assert kept.alive() and kept.cut_at() is None, "s1's other grant keeps its flow"
    cond = world.wait(
        lambda: (c := rendered(world)).get("reason") == "PartlyRendered" and c, 10, "PartlyRendered"
    )
    assert "VPNPeer/tenant-acme/s2: spec.ipsec.remoteSubnets[0]" in cond["message"], cond
    world.wait(lambda: "s2" not in world.tunnels(), 15, "s2, left out, gone from the status")


def test_a_deleted_peers_tunnel_goes_while_a_sibling_is_invalid(world: E2EWorld) -> None:
    sites, _ = bring_up(world, road_warrior=True)
    s2 = peer_doc(world, sites, "s2")
    s2["spec"]["ipsec"]["id"] = "s1.lab.example"  # already s1's: s2 is left out
    world.apply([s2])
    world.wait(lambda: rendered(world).get("reason") == "PartlyRendered", 10, "s2 left out")
    world.wait(lambda: "laptop" in (gateway_sas(world) or {}), 10, "the road warrior's IKE_SA")
    world.kubectl("delete", "vpnpeer", "laptop", "-n", NS)
    world.wait(
        lambda: "laptop" not in (gateway_sas(world) or {"laptop": 1}), 15, "the deleted peer's IKE_SA gone"
    )
    world.wait(lambda: "laptop" not in world.tunnels(), 15, "and gone from the status")
    assert world.established(["s1"]), "the valid sibling keeps its tunnel"
    assert not world.reaches(sites["laptop"], world.vip("web"), 80), "the deleted peer reaches nothing"
