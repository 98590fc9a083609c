"""The gateway pod settings canonicalised at start as the API server stores them, or refused naming the
field and the rule (controller.settings: ``canonical_quantity``, ``canonical_toleration``, requests at most
limits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.settings import SettingsError, canonical_quantity, canonical_toleration, from_config
from lab.kubeapi.quantity import canonical, parse, round_up
from tests.component.test_controller_quantities import CANONICAL, GATEWAY_POD, TOLERATIONS

CORPUS = json.loads((Path(__file__).parent / "quantity" / "apimachinery-v0.35.4.json").read_text())


@pytest.mark.parametrize(
    "text, want",
    [("0.5", "500m"), ("1024Mi", "1Gi"), ("1000m", "1"), ("0.1Gi", "107374182400m"), ("1.5Gi", "1536Mi"),
     ("0.5Ki", "512"), ("01", "1"), ("1.", "1"), ("1e3", "1e3"), ("1.5e3", "1500"), ("1E", "1E"), ("0", "0"),
     ("0.1n", "1m"), ("1001u", "2m"), ("0.0001", "1m")],
)  # fmt: skip
def test_canonical_quantity(text: str, want: str) -> None:
    assert canonical_quantity(text) == want


def test_every_quantity_the_settings_take_is_one_the_server_keeps_as_is_with_the_same_value() -> None:
    """Against the emulator's quantity, itself checked against apimachinery on the same corpus, rounded up
    to 1m as a request or limit is (SetDefaults_ResourceList)."""
    taken = 0
    for text, server in CORPUS:
        try:
            mine = canonical_quantity(text)
        except ValueError:
            continue
        taken += 1
        assert canonical(mine) == mine, (text, mine)  # stored unchanged: no diff at the next reconcile
        assert parse(mine).value == round_up(parse(text)).value, (text, mine, server)
    assert taken > 200


@pytest.mark.parametrize("text", ["-1", "+1", "1x", "", "1Kb", "9Ei", "1e9999"])
def test_what_is_no_quantity_here_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        canonical_quantity(text)


def pod(**fields: Any) -> dict[str, Any]:
    return {"gatewayPod": fields}


def test_the_settings_hold_what_the_server_will_store() -> None:
    s = from_config(pod(**GATEWAY_POD))
    assert {n: s.pod.resources[n].to_api() for n in CANONICAL} == CANONICAL
    assert list(s.pod.tolerations) == TOLERATIONS


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"resources": {"charon": {"requests": {"memory": "1Gi"}, "limits": {"memory": "0.5Gi"}}}},
            "config.gatewayPod.resources.charon.requests.memory: 1Gi is more than its limit 512Mi (the API "
            "server refuses a request above its limit: ValidateResourceRequirements)",
        ),
        (
            {"resources": {"charon": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}},
            "config.gatewayPod.resources.charon.requests.cpu: 2 is more than its limit 1500m",
        ),
        (
            {"resources": {"charon": {"requests": {"cpu": "-1"}}}},
            "config.gatewayPod.resources.charon.requests.cpu: '-1': not a quantity",
        ),
        (
            {"resources": {"charon": {"requests": {"cpu": True}}}},
            "config.gatewayPod.resources.charon.requests.cpu: True is not a cpu/memory quantity",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "tolerance": 1}]},
            "config.gatewayPod.tolerations[0]: unknown field(s) tolerance",
        ),
        (
            {"tolerations": [{"operator": "Equal", "value": "x"}]},
            "config.gatewayPod.tolerations[0].operator: must be Exists when key is empty",
        ),
        (
            {
                "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
                ]
            },
            "config.gatewayPod.tolerations[0].effect: must be NoExecute when tolerationSeconds is set",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "config.gatewayPod.tolerations[0].value: must be empty when operator is Exists",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Lt", "value": "1"}]},
            "config.gatewayPod.tolerations[0].operator: 'Lt' is not Equal or Exists",
        ),
        (
            {"tolerations": [{"key": "k", "effect": "Never"}]},
            "config.gatewayPod.tolerations[0].effect: 'Never' is not one of NoSchedule, PreferNoSchedule",
        ),
        (
            {"tolerations": [{"key": "a/b/c", "operator": "Exists"}]},
            "config.gatewayPod.tolerations[0].key: 'a/b/c' is not a qualified name",
        ),
        (
            {"tolerations": [{"key": "k", "value": "not a label"}]},
            "config.gatewayPod.tolerations[0].value: 'not a label' is not a label value",
        ),
        (
            {
                "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "60"}
                ]
            },
            "config.gatewayPod.tolerations[0].tolerationSeconds: '60' is not a whole number of seconds",
        ),
    ],
)
def test_what_the_server_would_refuse_is_refused_at_start_naming_the_field_and_the_rule(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError) as exc:
        from_config(pod(**fields))
    assert message in str(exc.value)


def test_a_helm_number_for_seconds_is_taken_and_an_equal_request_is_fine() -> None:
    assert canonical_toleration(
        {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60.0}, "t"
    ) == {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    s = from_config(
        pod(resources={"charon": {"requests": {"memory": "1024Mi"}, "limits": {"memory": "1Gi"}}})
    )
    assert s.pod.resources["charon"].to_api() == {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
