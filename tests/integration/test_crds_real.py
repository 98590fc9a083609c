"""The CRDs against the real kube-apiserver (lab.controlplane, v1.35): a differential check of the
admission that tests/component/test_crd_agreement.py emulates.

The real server installs our generated CRDs (it refuses a non-structural schema and a CEL rule over its
cost budget, neither of which the emulation checks), and then, with ``dryRun=All`` and strict field
validation (kubectl's default), gives its verdict on every object of the corpus and on hostile mutations.
Each verdict must be the one ``validate_object()`` gives and the one the emulated ``admitted()`` gives: a
difference is a bug in the CRDs, in Validate() or in the emulation, and this test names it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.api.crds import crds
from controller.api.validate import validate_object
from lab.controlplane import ControlPlane
from lab.wait import wait_for
from tests.component.test_crd_agreement import FIELDS, HOSTILE, admitted
from tests.component.test_crd_corpus import CORPUS, Case
from tests.examples import mutate

pytestmark = pytest.mark.lab

NAMESPACE = "t-crds-real"
EXAMPLE_NAMESPACES = {"tenant-acme", "tenant-old"}
"""The namespaces docs/examples use: the corpus objects are created in NAMESPACE instead."""


class Server:
    """The real API server's verdict on one object (a dry-run create: nothing is stored)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.plural = {
            c["spec"]["names"]["kind"]: (c["spec"]["group"], c["spec"]["names"]["plural"]) for c in crds()
        }

    def verdict(self, doc: Any) -> tuple[bool, str]:
        """(admitted, the server's message). Only 201 and the two refusals (422 Invalid, 400 BadRequest:
        strict decoding, a namespace that is not the request's) are verdicts; anything else fails."""
        res = self.create(doc)
        if res.status_code == 201:
            return True, ""
        status = res.json()
        assert res.status_code in (400, 422), f"not a verdict: {res.status_code} {status}"
        return False, str(status.get("message"))

    def status_of(self, doc: Any) -> int:
        return self.create(doc).status_code

    def create(self, doc: Any) -> httpx.Response:
        """A dry-run create of ``doc`` (in NAMESPACE where it names an example's namespace)."""
        body = copy.deepcopy(doc)
        md = body.get("metadata") if isinstance(body, dict) else None
        if isinstance(md, dict) and str(md.get("namespace")) in EXAMPLE_NAMESPACES:
            md["namespace"] = NAMESPACE
        kind = body.get("kind") if isinstance(body, dict) else None
        group, plural = self.plural.get(kind, self.plural["VPNGateway"])
        url = f"/apis/{group}/v1alpha1/namespaces/{NAMESPACE}/{plural}"
        return self.client.post(url, params={"dryRun": "All", "fieldValidation": "Strict"}, json=body)


@pytest.fixture(scope="module")
def server(_controlplane_session: ControlPlane) -> Iterator[Server]:
    cp = _controlplane_session
    docs = crds()
    versions = {c["spec"]["versions"][0]["name"] for c in docs}
    assert versions == {"v1alpha1"}, "Server.verdict builds URLs for v1alpha1"
    applied = cp.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert applied.returncode == 0, f"the real API server refused our CRDs: {applied.stderr}"
    cp.kubectl("create", "namespace", NAMESPACE)
    with cp.client() as client:
        names = [c["metadata"]["name"] for c in docs]
        conds: dict[str, dict[str, Any]] = {}

        def established() -> bool:
            for name in names:
                crd = client.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()
                conds[name] = {c["type"]: c for c in crd.get("status", {}).get("conditions", [])}
            return all(c.get("Established", {}).get("status") == "True" for c in conds.values())

        try:
            wait_for(established, 30, "the CRDs Established", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}: {json.dumps(conds)}") from None
        for name, c in conds.items():
            assert c["NamesAccepted"]["status"] == "True", name
            # The API server reports a schema it cannot use (not structural, CEL over budget) here.
            assert c.get("NonStructuralSchema", {}).get("status") != "True", c["NonStructuralSchema"]
        srv = Server(client)
        # Discovery follows Established by a moment: until it has, a create answers 404.
        probe = CORPUS[0].doc | {"metadata": {"name": "probe", "namespace": NAMESPACE}}
        wait_for(lambda: srv.status_of(probe) != 404, 30, "the CRs' endpoints", interval=0.2)
        yield srv
    cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    # Waited for: the next test that installs them (helm) must not meet them Terminating.
    cp.kubectl("delete", "-f", "-", "--timeout=30s", input=yaml.safe_dump_all(docs), check=False)


def test_the_real_server_installs_the_crds_with_their_cel_rules(server: Server) -> None:
    with_rules = [
        json.dumps(c["spec"]["versions"][0]["schema"]).count("x-kubernetes-validations") for c in crds()
    ]
    assert sum(with_rules) > 0
    ok, message = server.verdict(CORPUS[0].doc)
    assert (ok, message) == (CORPUS[0].expect is None, "")


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_the_real_server_admits_exactly_what_validate_admits(server: Server, case: Case) -> None:
    ok, message = server.verdict(case.doc)
    python_ok = validate_object(case.doc) == []
    assert ok == python_ok, f"real API server: {'admitted' if ok else message!r}; Validate(): {python_ok}"
    assert admitted(case.doc) == ok, "the emulated admission (test_crd_agreement) differs from the server"


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(field=st.sampled_from(FIELDS), value=HOSTILE)
def test_the_real_server_agrees_on_hostile_values(
    server: Server, field: tuple[dict[str, Any], list[Any]], value: str | None
) -> None:
    base, path = field
    doc = mutate(base, path, value)
    ok, message = server.verdict(doc)
    python_ok = validate_object(doc) == []
    assert ok == python_ok, (
        f"{'.'.join(map(str, path))}={value!r}: real API server "
        f"{'admitted' if ok else 'refused: ' + message}; Validate() {'admits' if python_ok else 'refuses'}"
    )
    assert admitted(doc) == ok, f"{'.'.join(map(str, path))}={value!r}: the emulation differs"
