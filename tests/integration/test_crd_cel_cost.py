"""The CEL cost of the CRDs' rules, estimated by the API server's own code (lab/celcost: the estimator of
k8s.io/apiextensions-apiserver v0.35.4, built by scripts/setup_celcost.sh into .tools/bin): every rule at
most half the per-rule limit and each CRD's total at most half the per-CRD limit, so a schema change that
makes a rule more expensive fails here, with the rule's name, long before kube-apiserver refuses the CRD.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CELCOST = shutil.which("celcost", path=str(ROOT / ".tools" / "bin")) or shutil.which("celcost")
MARGIN = 0.5
"""The share of the server's limits a rule (StaticEstimatedCostLimit) and a CRD
(StaticEstimatedCRDCostLimit) may use."""

pytestmark = pytest.mark.lab


def estimate(crds: str) -> dict[str, Any]:
    if CELCOST is None:
        pytest.fail("celcost is missing: run scripts/setup_celcost.sh (scripts/setup.sh runs it)")
    res = subprocess.run([CELCOST], input=crds, capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


@pytest.fixture(scope="module")
def costs() -> dict[str, Any]:
    crds = subprocess.run(
        [sys.executable, "-m", "controller", "crds"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return estimate(crds)


def test_every_rule_and_crd_stays_under_half_the_servers_limits(costs: dict[str, Any]) -> None:
    assert costs["ruleLimit"] == 10_000_000 and costs["crdLimit"] == 100_000_000  # v0.35.4's constants
    assert {v["crd"] for v in costs["versions"]} == {
        "vpngateways.vpn.bnerd.net",
        "vpnpeers.vpn.bnerd.net",
        "ipsecgateways.ipsec.bnerd.net",
        "clusterlinks.ipsec.bnerd.net",
    }
    over = []
    for v in costs["versions"]:
        assert not v["errors"], f"kube-apiserver would refuse {v['crd']}: {v['errors']}"
        over += [
            f"{v['crd']} {v['version']} {r['path']}: {r['cost']} = "
            f"{r['cost'] / costs['ruleLimit']:.0%} of the per-rule limit ({r['rule']})"
            for r in v["rules"]
            if r["cost"] + r["messageExpressionCost"] > MARGIN * costs["ruleLimit"]
        ]
        if v["total"] > MARGIN * costs["crdLimit"]:
            over.append(f"{v['crd']} {v['version']}: total {v['total']} of {costs['crdLimit']}")
    assert not over, "\n".join(over)


def test_the_estimate_is_the_one_the_server_refuses_a_crd_with() -> None:
    """A rule over an unbounded list of unbounded strings: the estimate is past the limit, and the
    server's own validation (run by the same tool) refuses the CRD for it, at that rule."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "listKind": "WidgetList", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "names": {"type": "array", "items": {"type": "string"}},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.names.all(a, self.names.all(b, a == b || a != b))"}
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    (v,) = estimate(yaml.safe_dump(crd))["versions"]
    (rule,) = v["rules"]
    assert rule["cost"] > 10_000_000
    refusal = (
        "properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget"
    )
    assert any(refusal in e for e in v["errors"]), v["errors"]
