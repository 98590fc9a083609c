"""``kubectl`` tells the whole story, against the REAL kube-apiserver (lab.controlplane, v1.35):

* ``kubectl get vpn -A`` lists instances of all four kinds (the CRDs' ``categories: [vpn]``);
* ``kubectl explain`` answers with a non-empty description for EVERY field path of every CRD (the schema
  walked: spec and status, down to list items' fields);
* the printer columns show a gateway's status as its writers write it (Ready, Tunnels, wide Reason), and
  a peer's Gateway, Type, State (empty until written), Age and wide Endpoint.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import pytest
import yaml

from controller.api.crds import crds
from lab.controlplane import ControlPlane
from lab.wait import wait_for
from tests.examples import example_docs
from tests.status_schema import controller_status, ipsec_agent_status, ipsec_plan, with_init_nat

pytestmark = pytest.mark.lab

NS = "t-crds-kubectl"


def field_paths(schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Every field path ``kubectl explain`` accepts (list items' fields without ``[]``), parents first."""
    for key, sub in (schema.get("properties") or {}).items():
        here = f"{path}.{key}" if path else key
        yield here
        node = sub
        while node.get("type") == "array" and isinstance(node.get("items"), Mapping):
            node = node["items"]
        yield from field_paths(node, here)


def description(explained: str) -> str:
    """The DESCRIPTION section of ``kubectl explain``'s output (``<empty>`` when the field has none)."""
    lines = explained.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DESCRIPTION:"))
    text = []
    for line in lines[at + 1 :]:
        if line and not line.startswith(" "):  # the next section (FIELDS:, ...)
            break
        text.append(line.strip())
    return " ".join(t for t in text if t)


@pytest.fixture(scope="module")
def installed(_controlplane_session: ControlPlane) -> Iterator[ControlPlane]:
    """The CRDs installed and NS made, once for the module (the tests apply the examples idempotently)."""
    controlplane = _controlplane_session
    docs = crds()
    controlplane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
    names = [c["metadata"]["name"] for c in docs]
    controlplane.kubectl("wait", "--for=condition=Established", "--timeout=30s", *(f"crd/{n}" for n in names))
    controlplane.kubectl("create", "namespace", NS)
    try:
        yield controlplane
    finally:
        controlplane.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        # Waited for: the next test that installs them (helm) must not meet them Terminating.
        controlplane.kubectl(
            "delete", "-f", "-", "--timeout=30s", input=yaml.safe_dump_all(docs), check=False
        )


def _apply(cp: ControlPlane, docs: list[dict[str, Any]]) -> None:
    docs = copy.deepcopy(docs)
    for d in docs:
        d["metadata"]["namespace"] = NS

    def applied() -> bool:  # discovery follows Established by a moment
        return cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), check=False).returncode == 0

    wait_for(applied, 30, "the examples applied", interval=0.5)


def test_kubectl_get_vpn_lists_all_four_kinds(installed: ControlPlane) -> None:
    _apply(installed, [*example_docs("ipsec.yaml"), *example_docs("legacy-ipsecgateway.yaml")])
    out = installed.kubectl("get", "vpn", "-A").stdout
    for c in crds():
        kind, group = c["spec"]["names"]["kind"], c["spec"]["group"]
        assert f"{kind.lower()}.{group}/" in out, f"kubectl get vpn -A lists no {kind}:\n{out}"


def test_kubectl_explain_describes_every_field(installed: ControlPlane) -> None:
    queries = [
        f"{c['spec']['names']['plural']}.{path}"
        for c in crds()
        for path in field_paths(c["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    ]
    assert len(queries) > 200 and "vpngateways.spec.ipsec.ike" in queries
    assert "vpngateways.status.tunnels.children.rekeyAt" in queries

    def explain(query: str) -> tuple[str, str]:
        res = installed.kubectl("explain", query, check=False)
        return query, description(res.stdout) if res.returncode == 0 else f"<failed: {res.stderr.strip()}>"

    wait_for(lambda: explain("vpngateways.spec")[1] not in ("", "<empty>"), 30, "the CRDs' OpenAPI published")
    with ThreadPoolExecutor(4) as pool:
        answers = dict(pool.map(explain, queries))
    missing = {q: d for q, d in answers.items() if not d or d == "<empty>" or d.startswith("<failed")}
    assert not missing, f"kubectl explain has no description for {len(missing)} fields: {missing}"
    ike = answers["vpngateways.spec.ipsec.ike"]
    assert "IKE" in ike and ike != "ike"


def _status(cp: ControlPlane, plural: str, name: str, status: Mapping[str, Any]) -> None:
    cp.kubectl(
        "patch", plural, name, "-n", NS, "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": status}),
    )  # fmt: skip


def test_printer_columns_show_a_gateway_with_a_status(installed: ControlPlane) -> None:
    gateway, site, _ = example_docs("ipsec.yaml")
    legacy, _ = example_docs("legacy-ipsecgateway.yaml")
    _apply(installed, [gateway, site, legacy])
    for plural, doc in (("vpngateways", gateway), ("ipsecgateways", legacy)):
        name = doc["metadata"]["name"]
        plan = ipsec_plan(doc["kind"], doc["apiVersion"], NS, name)
        _status(installed, plural, name, controller_status(1))
        agent = anyio.run(with_init_nat, ipsec_agent_status(plan, failing=True), None)
        _status(installed, plural, name, agent)
        out = installed.kubectl("get", plural, name, "-n", NS, "-o", "wide").stdout
        header, row = out.splitlines()
        # VPNGateway's wide columns end with Standby (StandbyReady's status: True in controller_status).
        standby = ["STANDBY"] if plural == "vpngateways" else []
        assert header.split()[-4 - len(standby) :] == ["READY", "TUNNELS", "AGE", "REASON", *standby], out
        cells = row.split()
        if standby:
            assert cells.pop() == "True", out
        assert cells[-1] == "PartlyRendered", out  # Ready's reason: the first failing condition's
        assert cells[-5:-2] == ["False", "1/2", "up"], out
        assert "n1" in cells and "203.0.113.10" in cells, out
    out = installed.kubectl("get", "vpnpeers", site["metadata"]["name"], "-n", NS, "-o", "wide").stdout
    header, row = out.splitlines()
    assert header.split() == ["NAME", "GATEWAY", "TYPE", "STATE", "AGE", "ENDPOINT"], out
    name, gw, kind, *rest = row.split()
    assert (name, gw, kind) == (site["metadata"]["name"], gateway["metadata"]["name"], "site"), out
    assert rest[-1] == site["spec"]["endpoint"] and len(rest) == 2, f"State is empty until written:\n{out}"
