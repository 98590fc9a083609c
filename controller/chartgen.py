"""The Helm chart's generated files, from the one source of each. Pure: returns text, writes nothing.

* ``templates/crds.yaml``: the CRDs (``controller.api.crds``, the rules the controller validates with), as a
  template rather than under crds/: Helm installs crds/ once and never upgrades it, while a template is
  upgraded with the release (cert-manager's and Tailscale's charts do the same). Behind ``crds.install``
  (read by the ``vpngw.crdsInstall`` helper, true when the key is absent: ``helm upgrade --reuse-values``
  from a release whose values had no ``crds``),
  with the chart's labels and ``helm.sh/resource-policy: keep``, so ``helm uninstall`` (or a release
  rendered with ``crds.install=false``) never deletes the CRDs and with them every gateway.
* ``files/controller-<scope>-rules.yaml``: the rules of each of the controller's Roles and ClusterRoles
  (``controller.rbac.SCOPES``), each right preceded by a comment saying which code uses it; the chart's
  templates include them verbatim, so the rendered manifests carry the comments too.

``python -m controller chart`` (``make chart``) writes ``generated_files()`` under helm/vpngw/ and copies
``COPIES`` from monitoring/; tests/component/test_helm_chart.py fails when the chart drifts from either.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import yaml

from controller.api.crds import crds
from controller.rbac import SCOPES, Right, Scope

CRDS = "templates/crds.yaml"


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


_CRD_HEADER = (
    "{{- /* Generated from controller/api/crds.py by `python -m controller chart` (make chart): do not edit."
    " */}}\n"
)
_CRD_METADATA = """  labels:
    {{- include "vpngw.labels" . | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep
"""


def crds_template() -> str:
    """The CRDs as one template: each under ``crds.install``, with the chart's labels and the keep policy.

    The CRD bodies are plain YAML (no ``{{``: checked), so the template engine passes them through."""
    docs = []
    for crd in crds():
        body = yaml.safe_dump(crd, sort_keys=False, default_flow_style=False, width=120)
        if "{{" in body:
            raise ValueError(f"{crd['metadata']['name']}: '{{{{' in a CRD would be read as a template action")
        name_line = f"metadata:\n  name: {crd['metadata']['name']}\n"
        if list(crd["metadata"]) != ["name"] or name_line not in body:
            raise ValueError(f"{crd['metadata']['name']}: metadata other than the name; extend crds_template")
        docs.append("---\n" + body.replace(name_line, name_line + _CRD_METADATA, 1))
    return _CRD_HEADER + '{{- if include "vpngw.crdsInstall" . }}\n' + "".join(docs) + "{{- end }}\n"


def generated_files() -> dict[str, str]:
    """Path relative to the chart's directory -> the file's content."""
    return {CRDS: crds_template(), **{rules_file(s): rules_yaml(s.rights, s.what) for s in SCOPES}}
