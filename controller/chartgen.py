"""The Helm chart's generated files, from the one source of each. Pure: returns text, writes nothing.

* ``crds/vpngw-crds.yaml``: the CRDs (``controller.api.crds``, the rules the controller validates with).
* ``files/controller-<scope>-rules.yaml``: the rules of each of the controller's Roles and ClusterRoles
  (``controller.rbac.SCOPES``), each right preceded by a comment saying which code uses it; the chart's
  templates include them verbatim, so the rendered manifests carry the comments too.

``python -m controller chart`` (``make chart``) writes ``generated_files()`` under helm/vpngw/ and copies
``COPIES`` from monitoring/; tests/component/test_helm_chart.py fails when the chart drifts from either.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from controller.api.crds import crds_yaml
from controller.rbac import SCOPES, Right, Scope

CRDS = "crds/vpngw-crds.yaml"


def rules_file(scope: Scope) -> str:
    return f"files/controller-{scope.name}-rules.yaml"


COPIES: dict[str, str] = {
    "files/alerts.yml": "monitoring/alerts.yml",
    "files/grafana-dashboard.json": "monitoring/grafana-dashboard.json",
}
"""Chart path -> repository path of the files the chart carries as byte-for-byte copies."""

_HEADER = "# Generated from controller/rbac.py by `python -m controller chart` (make chart): do not edit.\n"


def rules_yaml(rights: Iterable[Right], what: str) -> str:
    """A YAML list of RBAC rules, one per right, each under a comment naming the code that uses it.

    Lists are written as JSON flow sequences (valid YAML, every string quoted: the core group ``""`` and
    names like ``on`` stay strings)."""
    lines = [_HEADER.rstrip("\n"), f"# {what}"]
    for r in rights:
        rule = r.rule()
        lines.append(f"# {' '.join(r.why.split())}")  # one comment line, whatever the text
        lines.append(f"- apiGroups: {json.dumps(rule['apiGroups'])}")
        lines.append(f"  resources: {json.dumps(rule['resources'])}")
        lines.append(f"  verbs: {json.dumps(rule['verbs'])}")
    return "\n".join(lines) + "\n"


def generated_files() -> dict[str, str]:
    """Path relative to the chart's directory -> the file's content."""
    return {CRDS: crds_yaml(), **{rules_file(s): rules_yaml(s.rights, s.what) for s in SCOPES}}
