"""An HA gateway's desired objects (docs/ha.md "The build contract"), pure: slot a's objects as a gateway
without HA has them (enabling HA rolls no pod), slot b's ConfigMap, NAD and Deployment named
``<home_name>-b`` on their own NIC2 and node, the Lease created once and never written again, the pods'
Role granting that Lease by name; and HA off is today's objects exactly."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

import gwplan
from controller import diff
from controller.desired import (
    HA_SLOTS,
    HOME_INFORMER_KINDS,
    HOME_KINDS,
    HOME_SLOTS,
    SLOT_B,
    Desired,
    HaInputs,
    Inputs,
    Nic2,
    desired,
    home_slots,
    plan_of,
    slot_of,
)
from controller.names import (
    ANNOTATION_HASH,
    ANNOTATION_NIC_MAC,
    LABEL_HA_SLOT,
    LABEL_OWNER_UID,
    MULTUS_NETWORKS,
    GatewayKey,
    owner_of,
)
from controller.plan.render import with_nic
from controller.reconcile import render_gateway
from tests.unit.test_controller_desired import (
    CLOUD,
    GW_NS,
    HERE,
    IPSEC,
    NIC,
    SELECTOR,
    SETTINGS,
    snapshot,
)

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")


def plain_inputs() -> Inputs:
    """The example IPsec gateway's inputs as the reconcile builds them (its plan on slot a's NIC2),
    without HA."""
    snap = snapshot(IPSEC)
    plan = render_gateway(snap, SETTINGS).in_force
    assert plan is not None and CLOUD.nic is not None
    nic = CLOUD.nic
    plan = with_nic(
        plan, dataclasses.replace(plan.nic, mac=nic.mac, address=nic.address, gateway=nic.gateway)
    )
    return Inputs(snap.key, snap.uid, plan, SETTINGS, CLOUD.nic, HERE.node, snap.secrets)


def env_of(deployment: dict[str, Any], container: str) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == container]
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in c.get("env", [])}


def test_every_gateway_pods_agent_knows_its_pod_name_from_the_downward_api() -> None:
    """HA or not: enabling HA then never changes slot a's template (one roll, at the upgrade that brings
    it, which a new gateway image rolls anyway)."""
    dep = desired(plain_inputs()).get("Deployment")
    assert dep is not None
    env = env_of(dep, "status-agent")
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


NIC_B = Nic2("fa:16:3e:00:00:02", "192.0.2.3/26", "192.0.2.1")
LEASE = gwplan.Ha(lease="whatever-the-caller-says", lease_duration_seconds=3, renew_seconds=1.0)
HOME = KEY.home_name


def ha_inputs(node: str | None = "node-b", nic: Nic2 | None = NIC_B, lease: gwplan.Ha = LEASE) -> Inputs:
    return dataclasses.replace(plain_inputs(), ha=HaInputs(node=node, nic=nic, lease=lease))


def objects(d: Desired) -> dict[str, dict[str, Any]]:
    return dict(d.objects)


def as_api_holds(d: Desired) -> dict[str, dict[str, Any]]:
    """What the API holds after creating ``d``'s objects (server metadata, a defaulted field)."""
    out = {}
    for slot, obj in d.objects:
        o = copy.deepcopy(obj)
        o["metadata"].update(uid=f"uid-{slot}", resourceVersion="11")
        if obj["kind"] == "Deployment":
            o["spec"]["progressDeadlineSeconds"] = 600
        out[slot] = o
    return out


def test_ha_off_is_todays_objects_exactly() -> None:
    """``ha`` None: the slots, the order and every byte of a gateway without HA (the existing tests in
    test_controller_desired.py hold them), no HA label anywhere, a plan without ``ha``."""
    d = desired(plain_inputs())
    assert [s for s, _ in d.objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "TenantRole",
        "TenantRoleBinding",
        "NetworkPolicy",
        "ConfigMap",
        "NetworkAttachmentDefinition",
        "Deployment",
    ]
    assert LABEL_HA_SLOT not in json.dumps(d.objects)
    cm = d.get("ConfigMap")
    assert cm is not None and plan_of(cm).ha is None
    assert cm["data"]["plan.json"] == gwplan.dumps(plain_inputs().plan).decode()
    role = d.get("Role")
    assert role is not None and role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [HOME],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert desired(dataclasses.replace(plain_inputs(), ha=None)) == d


def test_an_ha_gateway_has_slot_b_and_a_lease_named_and_labelled_as_the_contract_says() -> None:
    d = desired(ha_inputs())
    assert [s for s, _ in d.objects] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "TenantRole",
        "TenantRoleBinding",
        "NetworkPolicy",
        "Lease",  # before the plans that name it
        "ConfigMap",
        "NetworkAttachmentDefinition",
        "Deployment",
        "ConfigMap/b",
        "NetworkAttachmentDefinition/b",
        "Deployment/b",
    ]
    assert d.held == frozenset()
    for slot, obj in d.objects:
        md = obj["metadata"]
        if slot.startswith("Tenant"):
            continue
        assert md["namespace"] == GW_NS
        assert md["labels"][LABEL_OWNER_UID] == "uid-gw" and owner_of(obj) == KEY, slot
        assert slot_of(obj, GW_NS) == slot
        if slot.endswith("/b"):
            assert md["name"] == f"{HOME}-b" and md["labels"][LABEL_HA_SLOT] == "b"
            assert home_slots(KEY)[slot] == (obj["kind"], f"{HOME}-b")
        else:
            assert md["name"] == HOME and LABEL_HA_SLOT not in md["labels"], slot
            assert home_slots(KEY)[slot] == (obj["kind"], HOME)
    assert len(f"{HOME}-b") <= 63


def test_each_slot_is_pinned_to_its_own_node_and_nic2_and_mounts_its_own_objects() -> None:
    objs = objects(desired(ha_inputs()))
    for slot, node, nic, name in (("", "node-a", NIC, HOME), ("/b", "node-b", NIC_B, f"{HOME}-b")):
        dep, nad = objs[f"Deployment{slot}"], objs[f"NetworkAttachmentDefinition{slot}"]
        tpl = dep["spec"]["template"]
        assert tpl["spec"]["nodeName"] == node
        assert tpl["metadata"]["annotations"][ANNOTATION_NIC_MAC] == nic.mac
        assert json.loads(tpl["metadata"]["annotations"][MULTUS_NETWORKS]) == [
            {"name": name, "namespace": GW_NS}
        ]
        assert nic.mac in nad["spec"]["config"]
        assert {"name": "plan", "configMap": {"name": name}} in tpl["spec"]["volumes"]
        (agent,) = [c for c in tpl["spec"]["containers"] if c["name"] == "status-agent"]
        cmd = agent["command"]
        assert cmd[cmd.index("--follow-configmap") + 1] == name
        assert env_of(dep, "status-agent")["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert tpl["spec"]["serviceAccountName"] == HOME, "one ServiceAccount (and Role) for both slots"
    b = objs["Deployment/b"]["spec"]
    assert b["selector"]["matchLabels"] == {**SELECTOR, LABEL_HA_SLOT: "b"}
    assert b["template"]["metadata"]["labels"][LABEL_HA_SLOT] == "b"
    a = objs["Deployment"]["spec"]
    assert a["selector"]["matchLabels"] == SELECTOR, "slot a's selector is immutable: never changes"
    assert LABEL_HA_SLOT not in a["template"]["metadata"]["labels"]
    policy = objs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
    assert policy.items() <= b["template"]["metadata"]["labels"].items(), "one NetworkPolicy covers both"


def test_both_plans_carry_the_lease_named_home_name_and_each_its_own_nic2() -> None:
    objs = objects(desired(ha_inputs()))
    a, b = plan_of(objs["ConfigMap"]), plan_of(objs["ConfigMap/b"])
    want = gwplan.Ha(lease=HOME, lease_duration_seconds=3, renew_seconds=1.0)
    assert a.ha == want and b.ha == want, "the Lease's name is home_name whatever the input said"
    assert (a.nic.mac, a.nic.address) == (NIC.mac, NIC.address)
    assert (b.nic.mac, b.nic.address, b.nic.gateway) == (NIC_B.mac, NIC_B.address, NIC_B.gateway)
    assert b.nic.reply_mark == a.nic.reply_mark
    assert a.ipsec is not None and b.ipsec is not None
    for plan, nic in ((a, NIC), (b, NIC_B)):
        assert plan.ipsec is not None
        for t in plan.ipsec.tunnels:
            for body in t.conn.values():
                assert body["local_addrs"] == [nic.address.split("/")[0]], "IKE leaves from the slot's NIC2"
    without = dataclasses.replace(
        b, ha=None, nic=a.nic, ipsec=dataclasses.replace(b.ipsec, tunnels=a.ipsec.tunnels)
    )
    assert dataclasses.replace(a, ha=None) == without, "otherwise the same plan"
    timing = gwplan.Ha(lease="x", lease_duration_seconds=5, renew_seconds=2.0)
    assert plan_of(objects(desired(ha_inputs(lease=timing)))["ConfigMap/b"]).ha == dataclasses.replace(
        timing, lease=HOME
    )


def test_enabling_ha_leaves_slot_as_pod_and_its_other_objects_alone() -> None:
    """Only slot a's plan (it gains ``ha``) and the pods' Role change: its Deployment is byte for byte the
    one a gateway without HA has, so no roll; and the same holds against the API's copy (no write)."""
    off, on = objects(desired(plain_inputs())), objects(desired(ha_inputs()))
    for slot in (
        "Deployment",
        "NetworkAttachmentDefinition",
        "ServiceAccount",
        "RoleBinding",
        "NetworkPolicy",
    ):
        assert on[slot] == off[slot], slot
    assert "TenantRole" in on and on["TenantRole"] == off["TenantRole"]
    held = as_api_holds(desired(plain_inputs()))
    acts, foreign = diff.plan_actions(desired(ha_inputs()).objects, held, "uid-gw")
    assert foreign == []
    written = {(type(a).__name__, slot_of(a.obj, GW_NS)) for a in acts if not isinstance(a, diff.Delete)}
    assert written == {
        ("Replace", "ConfigMap"),
        ("Replace", "Role"),
        ("Create", "Lease"),
        ("Create", "ConfigMap/b"),
        ("Create", "NetworkAttachmentDefinition/b"),
        ("Create", "Deployment/b"),
    }


def test_the_pods_role_grants_both_configmaps_and_get_update_of_its_lease_by_name_only() -> None:
    role = objects(desired(ha_inputs()))["Role"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [HOME, f"{HOME}-b"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [HOME],
            "verbs": ["get", "update"],
        },
    ]


def test_the_lease_is_created_with_no_holder_and_never_written_again() -> None:
    d = desired(ha_inputs())
    lease = d.get("Lease")
    assert lease is not None
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    assert (lease["metadata"]["name"], lease["metadata"]["namespace"]) == (HOME, GW_NS)
    assert lease["spec"] == {"leaseDurationSeconds": 3}, "no holderIdentity: the first agent takes it"
    assert diff.plan_actions([("Lease", lease)], {}, "uid-gw")[0] == [diff.Create(lease)]
    held = as_api_holds(d)["Lease"]
    taken = copy.deepcopy(held)
    taken["spec"] = {
        "holderIdentity": f"{HOME}-7c9d8f6b5-x2x4z",
        "leaseDurationSeconds": 3,
        "acquireTime": "2026-12-03T16:00:00.000000Z",
        "renewTime": "2026-12-03T16:00:41.000000Z",
        "leaseTransitions": 4,
    }
    taken["metadata"]["annotations"][ANNOTATION_HASH] = "edited"
    taken["metadata"]["labels"]["someone"] = "else"
    longer = desired(ha_inputs(lease=gwplan.Ha(lease=HOME, lease_duration_seconds=9)))  # our wish changed
    for have in (held, taken):
        for want in (d, longer):
            acts, foreign = diff.plan_actions(want.objects, {**as_api_holds(d), "Lease": have}, "uid-gw")
            assert (
                foreign == []
                and [a for a in acts if not isinstance(a, diff.Delete) and a.obj["kind"] == "Lease"] == []
            ), "the agents' Lease is theirs: never repaired"
    theirs = copy.deepcopy(held)
    theirs["metadata"]["labels"][LABEL_OWNER_UID] = "uid-other"
    acts, foreign = diff.plan_actions([("Lease", lease)], {"Lease": theirs}, "uid-gw")
    assert acts == [] and foreign == [diff.Foreign("Lease", f"{GW_NS}/{HOME}")]


def test_an_ha_gateway_in_order_asks_for_no_write() -> None:
    d = desired(ha_inputs())
    assert diff.plan_actions(d.objects, as_api_holds(d), "uid-gw") == ([], [])


@pytest.mark.parametrize(
    ("node", "nic", "held", "made"),
    [
        pytest.param(
            None, NIC_B, {"Deployment/b"}, {"ConfigMap/b", "NetworkAttachmentDefinition/b"}, id="no-node"
        ),
        pytest.param(
            "node-b",
            None,
            {"ConfigMap/b", "NetworkAttachmentDefinition/b", "Deployment/b"},
            set(),
            id="no-nic",
        ),
    ],
)
def test_slot_b_without_its_node_or_nic2_is_held_and_slot_a_goes_on(
    node: str | None, nic: Nic2 | None, held: set[str], made: set[str]
) -> None:
    d = desired(ha_inputs(node=node, nic=nic))
    assert d.held == held
    slots = {s for s, _ in d.objects}
    assert slots & set(SLOT_B) == made
    assert {"Lease", "ConfigMap", "Deployment"} <= slots
    role = d.get("Role")
    assert role is not None and role["rules"][0]["resourceNames"] == [HOME, f"{HOME}-b"]


def test_ha_turned_off_deletes_slot_b_and_the_lease_pod_first_and_only_ours() -> None:
    on = as_api_holds(desired(ha_inputs()))
    off = desired(plain_inputs())
    gone = diff.surplus(off.objects, off.held, on, "uid-gw", HA_SLOTS, "HA is off")
    assert [(g.kind, g.name, g.uid) for g in gone] == [
        ("Deployment", f"{HOME}-b", "uid-Deployment/b"),
        ("NetworkAttachmentDefinition", f"{HOME}-b", "uid-NetworkAttachmentDefinition/b"),
        ("ConfigMap", f"{HOME}-b", "uid-ConfigMap/b"),
        ("Lease", HOME, "uid-Lease"),
    ]
    still = desired(ha_inputs(node=None, nic=None))
    assert [g.kind for g in diff.surplus(still.objects, still.held, on, "uid-gw", HA_SLOTS, "-")] == [], (
        "held while slot b's NIC2 is unknown: neither written nor deleted"
    )
    on_ours = desired(ha_inputs())
    assert diff.surplus(on_ours.objects, on_ours.held, on, "uid-gw", HA_SLOTS, "-") == []
    foreign = {**on, "Lease": {**on["Lease"], "metadata": {**on["Lease"]["metadata"], "labels": {}}}}
    assert [g.kind for g in diff.surplus(off.objects, off.held, foreign, "uid-gw", HA_SLOTS, "-")] == [
        "Deployment",
        "NetworkAttachmentDefinition",
        "ConfigMap",
    ], "a Lease of that name not ours stays"


def test_the_home_slots_are_a_gateways_kinds_and_slot_bs_and_the_lease() -> None:
    assert home_slots(KEY) == {
        **{k: (k, HOME) for k in HOME_KINDS},
        "Deployment/b": ("Deployment", f"{HOME}-b"),
        "NetworkAttachmentDefinition/b": ("NetworkAttachmentDefinition", f"{HOME}-b"),
        "ConfigMap/b": ("ConfigMap", f"{HOME}-b"),
        "Lease": ("Lease", HOME),
    }
    assert list(HOME_SLOTS) == [*HOME_KINDS, *HA_SLOTS]
    assert tuple(HOME_INFORMER_KINDS) == (*HOME_KINDS, "Lease")
