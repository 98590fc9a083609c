"""diff.covers: lists mutating admission adds to (a Deployment's pod template) hold ours among others;
every other list is ours exactly."""

from __future__ import annotations

from typing import Any

from controller.diff import SHARED_LISTS, covers

DEPLOYMENT = SHARED_LISTS["Deployment"]


def template(containers: list[dict[str, Any]], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": containers, "tolerations": tolerations}}}}


OURS = template(
    [{"name": "charon", "image": "gw:1", "env": [{"name": "A", "value": "1"}]}],
    [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}],
)


def test_a_webhooks_sidecar_env_and_toleration_are_allowed_beside_ours() -> None:
    mutated = template(
        [
            {"name": "sidecar", "image": "proxy:1"},
            {
                "name": "charon",
                "image": "gw:1",
                "env": [{"name": "A", "value": "1"}, {"name": "P", "value": "x"}],
            },
        ],
        [{"key": "other", "operator": "Exists"}, *OURS["spec"]["template"]["spec"]["tolerations"]],
    )
    assert covers(mutated, OURS, DEPLOYMENT)
    assert not covers(mutated, OURS), "without the shared lists: a rewrite at every reconcile"


def test_ours_changed_or_gone_is_still_seen() -> None:
    image = template([{"name": "charon", "image": "gw:2", "env": [{"name": "A", "value": "1"}]}], [])
    assert not covers(image, OURS, DEPLOYMENT)
    gone = template(
        [{"name": "sidecar", "image": "proxy:1"}], OURS["spec"]["template"]["spec"]["tolerations"]
    )
    assert not covers(gone, OURS, DEPLOYMENT)
    env_changed = template([{"name": "charon", "image": "gw:1", "env": [{"name": "A", "value": "2"}]}], [])
    assert not covers(env_changed, OURS, DEPLOYMENT)


def test_elsewhere_a_list_is_ours_exactly() -> None:
    policy = {"spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}}
    widened = {
        "spec": {"ingress": [*policy["spec"]["ingress"], {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}
    }
    assert not covers(widened, policy, SHARED_LISTS.get("NetworkPolicy", frozenset()))
