"""The status tells the truth when a write fails (issue 21, item 5), pure: the writes the API refused
become ``OwnedObjects=False`` with the API's reason and message (never an object's content), said once
however often the reconcile is retried."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from controller import diff
from controller.reconcile import outcome
from controller.status import WriteFailure, owned_condition, whose
from tests.unit.test_controller_desired import GW_NS, HOME, IPSEC, LATER, run, snapshot

NAD_MISSING = WriteFailure(
    "NetworkAttachmentDefinition",
    f"{GW_NS}/{HOME}",
    "create",
    404,
    "NotFound",
    "the API server does not serve NetworkAttachmentDefinition (its CustomResourceDefinition is not "
    "installed): 404 page not found",
)
TAKEN = WriteFailure(
    "NetworkPolicy",
    f"{GW_NS}/{HOME}",
    "create",
    409,
    "AlreadyExists",
    f'networkpolicies.networking.k8s.io "{HOME}" already exists',
    "labels app.kubernetes.io/managed-by=someone-else; ownerReferences none",
)
# The real server's words (kube-apiserver v1.35, RBAC's escalation check) for a Role it refuses.
FORBIDDEN = WriteFailure(
    "Role",
    "tenant-acme/vpngw-acme",
    "create",
    403,
    "Forbidden",
    'roles.rbac.authorization.k8s.io "vpngw-acme" is forbidden: user "system:serviceaccount:vpngw-system:'
    'vpngw-controller" is attempting to grant RBAC permissions not currently held',
)


def conds(status: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_without_failures_the_status_is_the_decisions_own() -> None:
    d = run(snapshot(IPSEC))
    assert d.report is not None
    assert outcome(d.report) == (d.status, list(d.events))
    assert "OwnedObjects" not in conds(d.status)


def test_refused_writes_are_said_with_the_apis_reason_and_message_and_make_the_gateway_unready() -> None:
    d = run(snapshot(IPSEC))
    assert d.report is not None
    status, events = outcome(d.report, [NAD_MISSING, TAKEN, FORBIDDEN])
    c = conds(status)
    owned = c["OwnedObjects"]
    assert owned["status"] == "False" and owned["reason"] == "NotFound", "the first refusal's reason"
    for f in (NAD_MISSING, TAKEN, FORBIDDEN):
        assert f"{f.verb} {f.kind} {f.name}: {f.reason}: {f.message}" in owned["message"]
    assert "app.kubernetes.io/managed-by=someone-else" in owned["message"], "whose the object of our name is"
    assert c["Ready"]["status"] == "False" and "OwnedObjects" in c["Ready"]["message"]
    assert [(e.type, e.reason) for e in events if e.reason == "NotFound"] == [("Warning", "NotFound")]
    # Never an object's content: nothing of the plan the ConfigMap carries (nor of anything else written).
    for action in d.actions:
        assert isinstance(action, diff.Create)
        for value in (action.obj.get("data") or {}).values():
            assert value not in str(status)


def test_a_refusal_that_stays_is_said_once_however_often_the_reconcile_is_retried() -> None:
    first = run(snapshot(IPSEC))
    assert first.report is not None
    status, events = outcome(first.report, [TAKEN])
    assert [e.reason for e in events].count("AlreadyExists") == 1
    gw = copy.deepcopy(dict(snapshot(IPSEC).gateway))
    gw["status"] = status
    retry = run(dataclasses.replace(snapshot(IPSEC), gateway=gw), now=LATER)
    assert retry.report is not None
    again, events = outcome(retry.report, [TAKEN])
    assert again is None and events == [], "the same failure, seen in the status: no write, no Event"
    healed, events = outcome(retry.report, [])
    assert healed is not None and "OwnedObjects" not in conds(healed)


def test_an_object_of_our_name_in_the_cache_and_a_refused_write_share_one_condition() -> None:
    both = owned_condition(["ConfigMap/gw/x"], [FORBIDDEN])
    assert both is not None and both.reason == "Forbidden"
    assert "ConfigMap/gw/x exist and do not belong to this gateway" in both.message
    only = owned_condition(["ConfigMap/gw/x"], [])
    assert only is not None and only.reason == "ObjectNameTaken"
    assert owned_condition([], []) is None


def test_whose_an_object_is_comes_from_its_labels_and_owner_references_never_its_content() -> None:
    obj = {
        "metadata": {
            "name": "x",
            "labels": {"app": "theirs"},
            "ownerReferences": [{"kind": "HelmRelease", "name": "other", "uid": "u"}],
        },
        "data": {"plan": "very-secret-psk"},
    }
    said = whose(obj)
    assert said == "labels app=theirs; ownerReferences HelmRelease/other"
    assert whose({"metadata": {"name": "x"}}) == "labels none; ownerReferences none"
