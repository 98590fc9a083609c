"""diff.covers: in a Deployment's pod template, tolerations and pull secrets a mutating webhook adds stay
beside ours; containers, volumes and env are ours exactly (the gateway pod holds NET_ADMIN, NIC2 and the
tunnels' keys: a sidecar someone added goes)."""

from __future__ import annotations

from typing import Any

from controller.diff import SHARED_LISTS, covers

DEPLOYMENT = SHARED_LISTS["Deployment"]


def template(containers: list[dict[str, Any]], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": containers, "tolerations": tolerations}}}}


CHARON = {"name": "charon", "image": "gw:1", "env": [{"name": "A", "value": "1"}]}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
OURS = template([CHARON], [UNREACHABLE])


def test_a_webhooks_toleration_is_allowed_beside_ours() -> None:
    mutated = template([CHARON], [{"key": "other", "operator": "Exists"}, UNREACHABLE])
    assert covers(mutated, OURS, DEPLOYMENT)
    assert not covers(mutated, OURS), "without the shared lists: a rewrite at every reconcile"


def test_a_sidecar_or_an_env_var_someone_added_is_restored_away() -> None:
    sidecar = template([{"name": "sidecar", "image": "proxy:1"}, CHARON], [UNREACHABLE])
    assert not covers(sidecar, OURS, DEPLOYMENT)
    env = template(
        [{**CHARON, "env": [*CHARON["env"], {"name": "LD_PRELOAD", "value": "/x.so"}]}], [UNREACHABLE]
    )
    assert not covers(env, OURS, DEPLOYMENT)


def test_ours_changed_or_gone_is_still_seen() -> None:
    assert not covers(template([{**CHARON, "image": "gw:2"}], [UNREACHABLE]), OURS, DEPLOYMENT)
    assert not covers(template([CHARON], [{"key": "other", "operator": "Exists"}]), OURS, DEPLOYMENT)


def test_elsewhere_a_list_is_ours_exactly() -> None:
    policy = {"spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}}
    widened = {
        "spec": {"ingress": [*policy["spec"]["ingress"], {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}
    }
    assert not covers(widened, policy, SHARED_LISTS.get("NetworkPolicy", frozenset()))
