"""The emulator's pure parts, table-driven: selectors, patches, RBAC, tables, protobuf, the store."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import pytest

from lab.kubeapi import protobuf, rbac
from lab.kubeapi.errors import ApiError
from lab.kubeapi.patch import PatchError, apply_merge, json_patch, merge_patch, strategic_merge
from lab.kubeapi.resources import Registry
from lab.kubeapi.selectors import match_fields, match_labels, parse_fields, parse_labels
from lab.kubeapi.store import DeleteOptions, Store
from lab.kubeapi.tables import human_duration, jsonpath

REG = Registry()
PODS = REG.get("", "pods")
CMS = REG.get("", "configmaps")
assert PODS is not None and CMS is not None


def _obj(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "x", "labels": labels}}


@pytest.mark.parametrize(
    "selector, labels, matches",
    [
        pytest.param("a=1", {"a": "1"}, True, id="eq"),
        pytest.param("a==1", {"a": "2"}, False, id="eqeq-miss"),
        pytest.param("a!=1", {}, True, id="neq-absent-matches"),
        pytest.param("a in (1, 2)", {"a": "2"}, True, id="in"),
        pytest.param("a notin (1,2)", {}, True, id="notin-absent-matches"),
        pytest.param("a notin (1,2)", {"a": "1"}, False, id="notin-miss"),
        pytest.param("a", {"a": ""}, True, id="exists"),
        pytest.param("!a", {"b": "1"}, True, id="not-exists"),
        pytest.param("a,b=2", {"a": "1", "b": "2"}, True, id="and"),
        pytest.param("a>5", {"a": "7"}, True, id="gt"),
        pytest.param("app.kubernetes.io/name=gw", {"app.kubernetes.io/name": "gw"}, True, id="prefixed-key"),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert match_labels(parse_labels(selector), _obj(**labels)) is matches


@pytest.mark.parametrize("selector", ["a b", "a in (x", "=x", "a=b=c", "a=" + "v" * 64])
def test_malformed_label_selectors_are_400(selector: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_labels(selector)
    assert err.value.code == 400


def test_field_selectors_per_kind() -> None:
    assert PODS is not None and CMS is not None
    pod = {
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    assert match_fields(parse_fields("spec.nodeName=n1,status.phase!=Pending", PODS), pod, PODS)
    assert not match_fields(parse_fields("metadata.namespace=other", PODS), pod, PODS)
    assert match_fields(parse_fields("spec.hostNetwork=false", PODS), pod, PODS)
    with pytest.raises(ApiError) as err:
        parse_fields("spec.nodeName=n1", CMS)
    assert (
        err.value.message
        == '"spec.nodeName" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )


@pytest.mark.parametrize(
    "target, patch, result",
    [  # RFC 7386 appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ],
)
def test_merge_patch_rfc7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


@pytest.mark.parametrize(
    "ops, message",
    [
        pytest.param(
            [{"op": "test", "path": "/a", "value": 2}],
            "testing value /a failed: test failed",
            id="test-value",
        ),
        pytest.param(
            [{"op": "test", "path": "/b", "value": True}],
            "testing value /b failed: test failed",
            id="test-bool-vs-int",
        ),
        pytest.param(
            [{"op": "remove", "path": "/zz"}],
            "remove operation does not apply: doc is missing path: '/zz': missing value",
            id="remove-missing",
        ),
        pytest.param(
            [{"op": "replace", "path": "/zz", "value": 1}],
            "replace operation does not apply: doc is missing key: /zz: missing value",
            id="replace-missing",
        ),
    ],
)
def test_json_patch_failures(ops: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(PatchError) as err:
        json_patch({"a": 1, "b": 1, "l": [1]}, ops)
    assert str(err.value) == message


def test_json_patch_array_ops_and_escaping() -> None:
    doc = {"l": [1, 3], "a/b": {"~": 1}}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/l/1", "value": 2},
            {"op": "add", "path": "/l/-", "value": 4},
            {"op": "test", "path": "/a~1b/~0", "value": 1.0},
        ],
    )
    assert out["l"] == [1, 2, 3, 4] and doc["l"] == [1, 3]


def test_strategic_merge_directives() -> None:
    live = {
        "spec": {
            "containers": [
                {"name": "a", "image": "1", "ports": [{"containerPort": 80, "name": "x"}]},
                {"name": "b"},
            ],
            "finalizers": ["f1"],
            "m": {"k1": 1, "k2": 2},
        }
    }
    patch = {
        "spec": {
            "containers": [
                {"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 81}]},
                {"name": "c"},
            ],
            "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
            "finalizers": ["f2"],
            "m": {"$retainKeys": ["k2", "k3"], "k3": 3},
            "$deleteFromPrimitiveList/finalizers": ["f1"],
        }
    }
    out = strategic_merge(live, patch)
    assert [c["name"] for c in out["spec"]["containers"]] == ["c", "a", "b"]
    assert out["spec"]["containers"][1]["ports"] == [
        {"containerPort": 80, "name": "x", "protocol": "TCP"},
        {"containerPort": 81},
    ]
    assert out["spec"]["m"] == {"k2": 2, "k3": 3}
    assert strategic_merge({"a": {"b": 1}}, {"a": {"$patch": "replace", "c": 2}}) == {"a": {"c": 2}}
    assert strategic_merge({"a": {"b": 1}, "z": 1}, {"a": {"$patch": "delete"}}) == {"z": 1}
    assert strategic_merge(
        {"env": [{"name": "A"}, {"name": "B"}]}, {"env": [{"name": "A", "$patch": "delete"}]}
    ) == {"env": [{"name": "B"}]}


def test_apply_merge_associative_lists_and_removed_fields() -> None:
    schema = {
        "properties": {
            "spec": {
                "properties": {
                    "peers": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object"},
                    }
                }
            }
        }
    }
    live = {
        "spec": {
            "peers": [{"name": "a", "ip": "1"}, {"name": "b", "ip": "2"}, {"name": "theirs"}],
            "mine": 1,
            "keep": 2,
        }
    }
    previous = {"spec": {"peers": [{"name": "a"}, {"name": "b"}], "mine": 1}}
    config = {"spec": {"peers": [{"name": "a", "ip": "9"}]}}
    out = apply_merge(live, config, previous, schema)
    assert out == {"spec": {"peers": [{"name": "a", "ip": "9"}, {"name": "theirs"}], "keep": 2}}


def _snap(*objs: dict[str, Any]) -> rbac.Snapshot:
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs if o["kind"] == "Role"}
    crs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}
    return rbac.Snapshot(
        roles,
        crs,
        [o for o in objs if o["kind"] == "RoleBinding"],
        [o for o in objs if o["kind"] == "ClusterRoleBinding"],
    )


SA = rbac.service_account_user("t", "gw")
ROLE = {
    "kind": "Role",
    "metadata": {"name": "r", "namespace": "t"},
    "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["plan"]},
        {"apiGroups": ["vpn.bnerd.net"], "resources": ["*/status"], "verbs": ["patch"]},
    ],
}
CROLE = {
    "kind": "ClusterRole",
    "metadata": {"name": "c", "labels": {"agg": "yes"}},
    "rules": [{"apiGroups": ["*"], "resources": ["leases"], "verbs": ["*"]}],
}
AGG = {
    "kind": "ClusterRole",
    "metadata": {"name": "agg"},
    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "yes"}}]},
}
RB = {
    "kind": "RoleBinding",
    "metadata": {"name": "b", "namespace": "t"},
    "roleRef": {"kind": "Role", "name": "r"},
    "subjects": [{"kind": "ServiceAccount", "name": "gw"}],
}
RB_C = {
    "kind": "RoleBinding",
    "metadata": {"name": "b2", "namespace": "t"},
    "roleRef": {"kind": "ClusterRole", "name": "agg"},
    "subjects": [{"kind": "Group", "name": "system:serviceaccounts:t"}],
}
SNAP = _snap(ROLE, CROLE, AGG, RB, RB_C)


@pytest.mark.parametrize(
    "attrs, allowed",
    [
        pytest.param(
            rbac.Attributes(SA, "get", True, "", "configmaps", "", "t", "plan"), True, id="resource-name"
        ),
        pytest.param(
            rbac.Attributes(SA, "get", True, "", "configmaps", "", "t", "other"), False, id="other-name"
        ),
        pytest.param(
            rbac.Attributes(SA, "list", True, "", "configmaps", "", "t", ""), False, id="list-without-name"
        ),
        pytest.param(
            rbac.Attributes(SA, "patch", True, "vpn.bnerd.net", "vpngateways", "status", "t", "gw"),
            True,
            id="star-subresource",
        ),
        pytest.param(
            rbac.Attributes(SA, "patch", True, "vpn.bnerd.net", "vpngateways", "", "t", "gw"),
            False,
            id="main-resource",
        ),
        pytest.param(
            rbac.Attributes(SA, "update", True, "coordination.k8s.io", "leases", "", "t", "l"),
            True,
            id="aggregated-clusterrole-via-rolebinding",
        ),
        pytest.param(
            rbac.Attributes(SA, "update", True, "coordination.k8s.io", "leases", "", "other", "l"),
            False,
            id="rolebinding-is-namespaced",
        ),
        pytest.param(
            rbac.Attributes(rbac.UserInfo("root", (rbac.MASTERS,)), "delete", True, "x", "y", "", "", "z"),
            True,
            id="masters",
        ),
    ],
)
def test_rbac_authorize(attrs: rbac.Attributes, allowed: bool) -> None:
    assert rbac.authorize(attrs, SNAP)[0] is allowed


def test_rbac_missing_role_is_named_in_the_reason() -> None:
    snap = _snap(
        {
            "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "t"},
            "roleRef": {"kind": "Role", "name": "gone"},
            "subjects": [{"kind": "ServiceAccount", "name": "gw"}],
        }
    )
    ok, reason = rbac.authorize(rbac.Attributes(SA, "get", True, "", "pods", "", "t", "p"), snap)
    assert not ok and reason == 'RBAC: role.rbac.authorization.k8s.io "gone" not found'


def test_escalation_check_is_validation_covers() -> None:
    # "*/log" covers any resource's log subresource; "pods/*" is no wildcard in RBAC
    owner = [{"apiGroups": [""], "resources": ["pods", "pods/*", "*/log"], "verbs": ["get", "list"]}]
    wanted = [{"apiGroups": [""], "resources": ["pods", "pods/log", "secrets"], "verbs": ["get", "delete"]}]
    missing = rbac.missing_rights(owner, wanted)
    assert rbac.compact(missing) == [
        '{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}',
        '{APIGroups:[""], Resources:["pods/log"], Verbs:["delete"]}',
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete"]}',
    ]


@pytest.mark.parametrize(
    "seconds, text",
    [
        (5, "5s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400, "3d"),
        (400 * 86400, "400d"),
        (800 * 86400, "2y70d"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_jsonpath_subset() -> None:
    obj = {
        "status": {
            "conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}],
            "ips": ["a", "b"],
        }
    }
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert jsonpath(obj, ".status.ips[1]") == ["b"]
    assert jsonpath(obj, "{.status.ips[*]}") == ["a", "b"]
    assert jsonpath(obj, ".status.missing") == []


def _pb_field(num: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = b""
        while True:
            b = n & 0x7F
            n >>= 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    return varint(num << 3 | 2) + varint(len(payload)) + payload


def test_protobuf_envelope_decodes_a_configmap() -> None:
    meta = (
        _pb_field(1, b"cfg") + _pb_field(3, b"") + _pb_field(11, _pb_field(1, b"app") + _pb_field(2, b"gw"))
    )
    cm = _pb_field(1, meta) + _pb_field(2, _pb_field(1, b"k") + _pb_field(2, b"v"))
    raw = protobuf.MAGIC + _pb_field(1, _pb_field(1, b"v1") + _pb_field(2, b"ConfigMap")) + _pb_field(2, cm)
    assert protobuf.decode(raw) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "labels": {"app": "gw"}},
        "data": {"k": "v"},
    }
    other = (
        protobuf.MAGIC
        + _pb_field(1, _pb_field(1, b"apps/v1") + _pb_field(2, b"Deployment"))
        + _pb_field(2, b"")
    )
    assert protobuf.decode(other) is None and protobuf.decode(b"{}") is None


def _store(history: int = 100) -> Store:
    return Store(clock=lambda: datetime(2026, 1, 1, tzinfo=UTC), history_size=history)


def test_store_history_compaction_and_watch_replay() -> None:
    s = _store(history=3)
    assert CMS is not None
    cm = s.create(CMS, "default", {"metadata": {"name": "a"}})
    start = cm["metadata"]["resourceVersion"]
    events: list[tuple[str, str]] = []
    for i in range(5):
        s.patch(CMS, "default", "a", "application/merge-patch+json", {"data": {"i": str(i)}})
    with pytest.raises(ApiError) as err:
        s.watch(CMS, "default", (), (), lambda t, o: None, resource_version=start)
    assert err.value.code == 410 and err.value.message == f"too old resource version: {start} ({s.rv - 3})"
    s.watch(
        CMS,
        "default",
        (),
        (),
        lambda t, o: events.append((t, o["data"]["i"])),
        resource_version=str(s.rv - 2),
    )
    assert events == [("MODIFIED", "3"), ("MODIFIED", "4")]


def test_store_gc_background_foreground_orphan() -> None:
    s = _store()
    assert CMS is not None

    def owned(name: str, owner: dict[str, Any], block: bool = False) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "blockOwnerDeletion": block,
                    }
                ],
            }
        }

    o = s.create(CMS, "default", {"metadata": {"name": "o"}})
    s.create(CMS, "default", owned("d1", o, block=True))
    s.create(CMS, "default", owned("d2", o))
    s.delete(CMS, "default", "o", DeleteOptions(propagation="Foreground"))
    s.run_gc()
    assert (
        s.peek(CMS, "default", "o") is None
        and s.peek(CMS, "default", "d1") is None
        and s.peek(CMS, "default", "d2") is None
    )
    o = s.create(CMS, "default", {"metadata": {"name": "o"}})
    s.create(CMS, "default", owned("d3", o))
    s.delete(CMS, "default", "o", DeleteOptions(propagation="Orphan"))
    s.run_gc()
    d3 = s.peek(CMS, "default", "d3")
    assert s.peek(CMS, "default", "o") is None and d3 is not None and "ownerReferences" not in d3["metadata"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"data": {"plan.json": "{}"}, "binaryData": {"plan.json": "e30="}},
            'data[plan.json]: Invalid value: "plan.json": duplicate of key present in binaryData',
            id="key-in-both",
        ),
        pytest.param(
            {"binaryData": {"plan.json": base64.b64encode(b"x" * (1024 * 1024 + 1)).decode()}},
            "[]: Too long: may not be more than 1048576 bytes",
            id="binary-over-1MiB-decoded",
        ),
        pytest.param(
            {"data": {"a b": "x"}}, 'data[a b]: Invalid value: "a b": a valid config key', id="bad-key"
        ),
    ],
)
def test_a_config_map_the_api_server_refuses_is_422(body: dict[str, Any], message: str) -> None:
    """ValidateConfigMap (kubernetes pkg/apis/core/validation/validation.go), on create and on patch."""
    s = _store()
    assert CMS is not None
    with pytest.raises(ApiError) as err:
        s.create(CMS, "default", {"metadata": {"name": "a"}, **body})
    assert err.value.code == 422 and message in err.value.message, err.value.message
    s.create(CMS, "default", {"metadata": {"name": "a"}, "data": {"plan.json": "{}"}})
    with pytest.raises(ApiError) as err:
        s.patch(CMS, "default", "a", "application/merge-patch+json", body)
    assert err.value.code == 422


def test_a_config_map_of_exactly_1_MiB_base64_encoded_over_it_is_taken() -> None:
    """The limit counts binaryData decoded: 1 MiB of bytes is 1.33 MiB of base64, and fits."""
    s = _store()
    assert CMS is not None
    blob = base64.b64encode(b"x" * (1024 * 1024)).decode()
    assert s.create(CMS, "default", {"metadata": {"name": "a"}, "binaryData": {"k": blob}})
