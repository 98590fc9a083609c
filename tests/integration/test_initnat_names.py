"""targetHost names are resolved as absolute names, with the real resolver (glibc getaddrinfo) against a
name server, as in a pod: the gateway pod lives in an operator-owned namespace, so its resolv.conf has
that namespace's search list and Kubernetes' ``ndots:5``.

The name server is a small one written here (A records from a table, NXDOMAIN for the rest; each query
logged), in the cluster namespace behind the pod's eth0 where cluster DNS would be; the gateway
namespace's resolv.conf (``/etc/netns/<ns>/resolv.conf``, bind-mounted by ``ip netns exec``) is a pod's.
init-nat runs as ``python -m initnat`` in the gateway namespace.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gwplan import Exposure, Grant, Port
from lab.wait import wait_for
from lab.world import CLUSTER_GW, Lab
from tests.integration.test_initnat_traffic import PY, Procs, plan, write_plan

pytestmark = [pytest.mark.lab]

NAME_SERVER = """
import socket, struct, sys
records = dict(arg.split("=") for arg in sys.argv[2:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 53))
print("listening", flush=True)
while True:
    q, peer = s.recvfrom(512)
    labels, i = [], 12
    while q[i]:
        labels.append(q[i + 1 : i + 1 + q[i]].decode()); i += 1 + q[i]
    qtype = struct.unpack("!H", q[i + 1 : i + 3])[0]
    question, name = q[12 : i + 5], ".".join(labels).lower()
    print("asked", name, qtype, flush=True)
    address = records.get(name)
    rcode = 3 if address is None else 0  # NXDOMAIN for every name not in the table
    answers = b""
    if address is not None and qtype == 1:
        answers = b"\\xc0\\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + socket.inet_aton(address)
    head = struct.pack("!HHHHHH", struct.unpack("!H", q[:2])[0], 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
    s.sendto(head + question + answers, peer)
"""

GATEWAY_NS = "vpngw-gateways"  # the operator's gateway namespace, whose search list the pod has
POD_RESOLV_CONF = (
    f"search {GATEWAY_NS}.svc.cluster.local svc.cluster.local cluster.local\n"
    f"nameserver {CLUSTER_GW}\noptions ndots:5\n"
)
REAL, HIJACK, OPERATORS = "192.0.2.70", "192.0.2.81", "192.0.2.80"
RECORDS = {
    "api.fabric.example": REAL,
    # What ndots:5 tries first for "api.fabric.example": a pod "api" under a headless Service "fabric" in a
    # namespace "example" answers this name; whoever owns that namespace would choose the target.
    "api.fabric.example.svc.cluster.local": HIJACK,
    f"db.{GATEWAY_NS}.svc.cluster.local": OPERATORS,  # a Service of the operator's gateway namespace
}


@pytest.fixture
def pod_dns(pod_lab: Lab, procs: Procs, tmp_path: Path) -> Iterator[str]:
    """The name server in the cluster namespace, and a pod's resolv.conf for the gateway namespace; yields
    the name of the server's output."""
    (tmp_path / "ns.py").write_text(NAME_SERVER)
    records = [f"{name}={address}" for name, address in RECORDS.items()]
    procs.start(pod_lab.hosts["cl"], PY, str(tmp_path / "ns.py"), CLUSTER_GW, *records, name="dns")
    wait_for(lambda: "listening" in procs.output("dns"), 10, "the name server")
    etc = Path("/etc/netns") / pod_lab.gw.ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text(POD_RESOLV_CONF)
    try:
        yield "dns"
    finally:
        shutil.rmtree(etc, ignore_errors=True)


def test_target_hosts_are_resolved_as_absolute_names_never_under_the_pods_search_list(
    pod_lab: Lab, procs: Procs, tmp_path: Path, pod_dns: str
) -> None:
    """Finding 5. ``api.fabric.example`` was resolved under the search list first (ndots:5) and took the
    address of ``api.fabric.example.svc.cluster.local``; ``db`` took the operator's Service. Now the first
    is asked as ``api.fabric.example.`` only, and ``db`` (a single label) is left out with its reason,
    DNS never asked about it."""
    lab = pod_lab
    p = plan(lab, (Grant("s1", "api", "exposure", ("203.0.113.0/28",), 0x30000),))
    exposures = (
        Exposure("api", "198.18.0.11", (Port(9090),), target_host="api.fabric.example"),
        Exposure("db", "198.18.0.12", (Port(5432),), target_host="db"),
    )
    p = dataclasses.replace(p, nat=dataclasses.replace(p.nat, exposures=exposures))
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, p)
    res = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), check=False)
    assert res.returncode == 0, res.stderr.decode()

    nat_rules = lab.gw.run("iptables-save", "-t", "nat").stdout.decode()
    assert f"--to-destination {HIJACK}:9090" not in nat_rules, "the search list's answer became the target"
    assert f"--to-destination {OPERATORS}:5432" not in nat_rules, (
        "a single label became the operator's Service"
    )
    assert f"--to-destination {REAL}:9090" in nat_rules
    asked = [line.split()[1] for line in procs.output(pod_dns).splitlines() if line.startswith("asked ")]
    assert asked and set(asked) == {"api.fabric.example"}, asked
    doc = json.loads((tmp_path / "initnat-status.json").read_text())
    (entry,) = doc["leftOut"]
    assert (entry["exposure"], entry["field"], entry["host"]) == ("db", "nat.exposures[1].targetHost", "db")
    assert entry["reason"].startswith("db is a single-label name: a targetHost must be fully qualified")
