"""The emulator's ``resource.Quantity`` (lab.kubeapi.quantity) and pod spec rules (lab.kubeapi.podspec).

``quantity/apimachinery-v0.35.4.json`` holds 506 strings and what k8s.io/apimachinery v0.35.4 makes of them
(``json.Unmarshal`` into a ``resource.Quantity``, then ``json.Marshal``; an error as ``ERR <message>``),
produced by ``quantity/canonical.go.txt`` built against the module cache that built the lab's
kube-apiserver: hand-picked cases (the suffix families, rounding, the string-reuse quirk, errors) and 400
random ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.kubeapi.errors import ApiError
from lab.kubeapi.podspec import Decoding, decode_pod_spec, validate_pod_spec
from lab.kubeapi.quantity import QuantityError, canonical, parse, round_up

CORPUS = json.loads((Path(__file__).parent / "quantity" / "apimachinery-v0.35.4.json").read_text())


def go(text: str) -> str:
    try:
        return canonical(text)
    except QuantityError as exc:
        return f"ERR {exc}"


def test_every_string_of_the_corpus_prints_as_apimachinery_prints_it() -> None:
    assert len(CORPUS) > 500
    wrong = [(text, want, go(text)) for text, want in CORPUS if go(text) != want]
    assert not wrong, wrong[:20]


@pytest.mark.parametrize(
    "text, want",
    [
        ("0.5", "500m"),
        ("1024Mi", "1Gi"),
        ("1000m", "1"),
        ("0.1Gi", "107374182400m"),  # not a whole number of bytes: decimal SI, no digit lost
        ("1.5Gi", "1536Mi"),  # binary stays binary when exact
        ("0.5Ki", "512"),  # under 1024: decimal
        ("1000", "1k"),
        ("0.1n", "1n"),  # finer than 1n: rounded up
        ("+1", "+1"),  # already canonical: the string as written
        ("1e3", "1e3"),
    ],
)
def test_the_named_rules(text: str, want: str) -> None:
    assert canonical(text) == want


def deployment_spec(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "i", **fields}]}


def test_the_pod_spec_decode_canonicalises_and_drops_what_the_go_types_have_not() -> None:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "resources": {"requests": {"cpu": 0.5, "memory": "1n"}, "limits": {}, "x": 1}}
        ],
        "initContainers": [{"name": "i", "resources": None}],
        "tolerations": [{"key": "k", "operator": "Exists", "value": "", "effect": None, "y": 2}],
        "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1024Ki"}}],
    }
    d = Decoding("Deployment", "v1", strict=False)
    decode_pod_spec(d, spec, "spec.template.spec")
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": "1m"}}
    assert spec["initContainers"][0]["resources"] == {}
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert spec["volumes"][0]["emptyDir"] == {"sizeLimit": "1Mi"}
    assert d.warnings == [
        'unknown field "spec.template.spec.containers[0].resources.x"',
        'unknown field "spec.template.spec.tolerations[0].y"',
    ]
    strict = Decoding("Deployment", "v1", strict=True)
    with pytest.raises(ApiError) as exc:
        decode_pod_spec(strict, {"tolerations": [{"key": "k", "y": 1}]}, "spec.template.spec")
    assert exc.value.code == 400 and "strict decoding error" in exc.value.message
    with pytest.raises(ApiError) as exc:
        decode_pod_spec(d, deployment_spec(resources={"limits": {"cpu": "1x"}}), "spec.template.spec")
    assert exc.value.code == 400
    assert exc.value.message == (
        'Deployment in version "v1" cannot be handled as a Deployment: quantities must match the regular '
        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )


def errors_of(spec: dict[str, Any]) -> list[str]:
    d = Decoding("Deployment", "v1", strict=False)
    decode_pod_spec(d, spec, "spec.template.spec")
    return [str(e) for e in validate_pod_spec(spec, "spec.template.spec")]


def test_requests_above_limits_and_bad_tolerations_are_invalid_in_the_servers_words() -> None:
    assert errors_of(
        deployment_spec(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "0.5Gi"}})
    ) == [
        'spec.template.spec.containers[0].resources.requests: Invalid value: "1Gi": must be less than or '
        "equal to memory limit of 512Mi"
    ]
    assert errors_of(deployment_spec(resources={"requests": {"cpu": "-1"}})) == [
        'spec.template.spec.containers[0].resources.requests[cpu]: Invalid value: "-1": must be greater than '
        "or equal to 0"
    ]
    assert errors_of(deployment_spec(resources={"requests": {"example.com/dev": "1"}})) == [
        "spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for non "
        "overcommitable resources"
    ]
    assert errors_of(deployment_spec(resources={"limits": {"gpu": "1"}})) == [
        'spec.template.spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard '
        "resource type or fully qualified",
        'spec.template.spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard '
        "resource for containers",
    ]
    assert errors_of({"tolerations": [{"operator": "Equal", "value": "x"}]}) == [
        'spec.template.spec.tolerations[0].operator: Invalid value: "Equal": operator must be Exists when '
        '`key` is empty, which means "match all values and all keys"'
    ]
    assert errors_of({"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]}) == [
        "spec.template.spec.tolerations[0].effect: Invalid value: \"\": effect must be 'NoExecute' when "
        "`tolerationSeconds` is set"
    ]
    assert errors_of({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}) == [
        'spec.template.spec.tolerations[0].operator: Invalid value: "v": value must be empty when '
        "`operator` is 'Exists'"
    ]
    assert errors_of({"tolerations": [{"key": "k", "operator": "Lt", "value": "1"}]}) == [
        'spec.template.spec.tolerations[0].operator: Unsupported value: "Lt": supported values: "Equal", '
        '"Exists", "Lt", "Gt"'
    ]
    assert errors_of({"tolerations": [{"key": "k", "effect": "Never"}]}) == [
        'spec.template.spec.tolerations[0].effect: Unsupported value: "Never": supported values: '
        '"NoSchedule", "PreferNoSchedule", "NoExecute"'
    ]
    assert errors_of({"tolerations": [{"key": "a/b/c", "operator": "Exists"}]})[0].startswith(
        'spec.template.spec.tolerations[0].key: Invalid value: "a/b/c": a valid label key must consist'
    )
    assert errors_of(deployment_spec(resources={"requests": {"cpu": "1"}, "limits": {"cpu": "1000m"}})) == []


@pytest.mark.parametrize(
    "text, want",
    [
        ("1n", "1m"),
        ("1001u", "2m"),
        ("+1", "+1"),
        ("1500m", "1500m"),
        ("0.1Gi", "107374182400m"),
        ("-1n", "-1m"),
    ],
)
def test_a_request_or_limit_is_rounded_up_to_1m_as_set_defaults_resource_list_does(
    text: str, want: str
) -> None:
    assert str(round_up(parse(text))) == want
