"""Admission (the generated CRDs) and Validate() agree: same verdict for every object of one corpus.

This tier EMULATES admission from the generated CRD documents alone (tests/integration/test_crds_real.py
checks the same verdicts against the real kube-apiserver), with the same engines the API server uses
where they exist in Python:

* structural schema: ``jsonschema`` over ``openAPIV3Schema`` with patterns matched by ``google-re2``
  (Go's regexp is RE2: ``$`` is end of text, no look-arounds), unknown fields rejected (kubectl's default
  strict server-side field validation), and ``x-kubernetes-list-type`` set/map duplicates rejected;
* ObjectMeta: ``metadata.name`` must be a DNS-1123 subdomain (the API server's generic check);
* nulls and defaults: a JSON null for a known non-nullable field is pruned (or defaulted), then defaults
  are applied, before any validation (``PruneNonNullableNullsWithoutDefaults`` and the structural
  defaulting of apiextensions-apiserver, mirrored below; Kubernetes docs "Defaulting and Nullable");
* CEL: every ``x-kubernetes-validations`` rule compiled and evaluated with ``celpy`` (cel-python) on
  ``self`` at its schema location, only when the structural schema passed (as the Python twin assumes).

Not emulated (documented in docs/api.md): the API server's CEL cost estimator.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import celpy
import jsonschema
import pytest
import re2
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.api.crds import crds
from controller.api.validate import validate_object
from tests.component.test_crd_corpus import CORPUS, GATEWAY, LEGACY_GW, PEER, WG_SITE, Case
from tests.examples import mutate

LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _strict(schema: dict[str, Any], root: bool = True) -> dict[str, Any]:
    """The schema as jsonschema should see it: unknown fields rejected where the CRD prunes them.
    ObjectMeta is the API server's own business (checked separately below)."""
    out = copy.deepcopy(schema)
    if out.get("type") == "object" and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    for key, sub in out.get("properties", {}).items():
        if not (root and key == "metadata"):
            out["properties"][key] = _strict(sub, root=False)
    if "items" in out:
        out["items"] = _strict(out["items"], root=False)
    return out


def _re2_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    if isinstance(instance, str) and re2.search(pattern, instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r} (RE2)")


Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
    jsonschema.Draft202012Validator, {"pattern": _re2_pattern}
)


@cache
def _crd_by_kind() -> dict[str, dict[str, Any]]:
    return {c["spec"]["names"]["kind"]: c for c in crds()}


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _list_duplicates(schema: Mapping[str, Any], value: Any) -> bool:
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        if kind == "set" and len({repr(v) for v in value}) != len(value):
            return True
        if kind == "map":
            names, fields = schema["x-kubernetes-list-map-keys"], schema["items"].get("properties", {})
            # The API server defaults before it validates: an absent key is its default.
            keys = [
                tuple(v.get(k, fields.get(k, {}).get("default")) for k in names)
                for v in value
                if isinstance(v, Mapping)
            ]
            if len(set(keys)) != len(keys):
                return True
        return any(_list_duplicates(schema["items"], v) for v in value)
    if isinstance(value, Mapping):
        props = schema.get("properties", {})
        return any(_list_duplicates(props[k], v) for k, v in value.items() if k in props)
    return False


def _rules_hold(schema: Mapping[str, Any], value: Any) -> bool:
    for r in schema.get("x-kubernetes-validations", []):
        try:
            result = _program(r["rule"]).evaluate({"self": json_to_cel(value)})
        except CELEvalError:
            return False  # an evaluation error rejects the object, as in the API server
        if not isinstance(result, celpy.celtypes.BoolType) or not bool(result):
            return False
    return True


def _cel_holds(schema: Mapping[str, Any], value: Any) -> bool:
    """Every CEL rule at every schema location (objects, lists' items, strings) holds."""
    if not _rules_hold(schema, value):
        return False
    if isinstance(value, Mapping):
        props = schema.get("properties", {})
        return all(_cel_holds(props[k], v) for k, v in value.items() if k in props)
    if isinstance(value, list) and "items" in schema:
        return all(_cel_holds(schema["items"], v) for v in value)
    return True


def _prune_nulls(x: Any, s: Mapping[str, Any] | None) -> None:
    """apiextensions-apiserver's ``PruneNonNullableNullsWithoutDefaults`` (schema/defaulting/prunenulls.go):
    a null for a known, non-nullable field without a default is deleted; lists' items are recursed into
    but a null item stays (and fails validation later)."""
    if isinstance(x, dict):
        for k in list(x):
            sub = (s or {}).get("properties", {}).get(k)
            if x[k] is None and sub is not None and not sub.get("nullable") and "default" not in sub:
                del x[k]
            else:
                _prune_nulls(x[k], sub)
    elif isinstance(x, list):
        items = (s or {}).get("items")
        for v in x:
            _prune_nulls(v, items)


def _default(x: Any, s: Mapping[str, Any] | None) -> None:
    """The API server's structural defaulting (schema/defaulting/algorithm.go): a missing field, or a null
    one that is not nullable, gets its default; then recurse."""
    if s is None:
        return
    if isinstance(x, dict):
        for k, prop in s.get("properties", {}).items():
            if "default" in prop and (k not in x or (x[k] is None and not prop.get("nullable"))):
                x[k] = copy.deepcopy(prop["default"])
        for k, v in x.items():
            _default(v, s.get("properties", {}).get(k))
    elif isinstance(x, list):
        for v in x:
            _default(v, s.get("items"))


def _as_stored(doc: Mapping[str, Any], schema: Mapping[str, Any]) -> Any:
    """A copy of ``doc`` null-pruned and defaulted, as the API server has it before validating."""
    out = copy.deepcopy(doc)
    _prune_nulls(out, schema)
    _default(out, schema)
    return out


def admitted(doc: Any) -> bool:
    """Would the API server (with our CRDs installed) accept this object?"""
    if not isinstance(doc, Mapping):
        return False
    crd = _crd_by_kind().get(doc.get("kind"))  # type: ignore[arg-type]
    if crd is None:
        return False
    version = crd["spec"]["versions"][0]
    if doc.get("apiVersion") != f"{crd['spec']['group']}/{version['name']}":
        return False
    md = doc.get("metadata")
    name = md.get("name") if isinstance(md, Mapping) else None
    if not isinstance(name, str) or len(name) > 253 or not SUBDOMAIN.fullmatch(name):
        return False
    namespace = md.get("namespace") if isinstance(md, Mapping) else None
    if namespace is not None and not (isinstance(namespace, str) and LABEL.fullmatch(namespace)):
        return False  # ObjectMeta: a namespace is a DNS label
    schema = version["schema"]["openAPIV3Schema"]
    doc = _as_stored(doc, schema)
    if not Validator(_strict(schema), format_checker=jsonschema.FormatChecker()).is_valid(doc):
        return False
    if _list_duplicates(schema, doc):
        return False
    return _cel_holds(schema, doc)


def _all_crd_rules() -> list[str]:
    """Every CEL rule of every generated CRD, in schema order."""
    rules: list[str] = []

    def walk(s: Mapping[str, Any]) -> None:
        rules.extend(r["rule"] for r in s.get("x-kubernetes-validations", []))
        for sub in s.get("properties", {}).values():
            walk(sub)
        if "items" in s:
            walk(s["items"])

    for c in crds():
        walk(c["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return rules


def test_every_crd_rule_compiles_in_standard_cel() -> None:
    rules = _all_crd_rules()
    assert len(rules) >= 12
    for rule in rules:
        _program(rule)  # raises on a syntax error or an unknown (extension) function


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_admission_and_validate_agree(case: Case) -> None:
    python_ok = validate_object(case.doc) == []
    assert python_ok == (case.expect is None), "corpus expectation"
    assert admitted(case.doc) == python_ok


def test_the_corpus_covers_every_cel_rule() -> None:
    """Each CEL rule rejects at least one corpus object that the structural schema alone admits."""
    fired: set[str] = set()
    for case in CORPUS:
        if case.expect is None:
            continue
        crd = _crd_by_kind().get(case.doc.get("kind", ""))
        if crd is None:
            continue
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        doc = _as_stored(case.doc, schema)
        if not Validator(_strict(schema)).is_valid(doc) or _list_duplicates(schema, doc):
            continue
        fired |= _failing_rules(schema, doc)
    assert set(_all_crd_rules()) - fired == set()


def _failing_rules(schema: Mapping[str, Any], value: Any) -> set[str]:
    out = {
        r["rule"]
        for r in schema.get("x-kubernetes-validations", [])
        if not _rules_hold({"x-kubernetes-validations": [r]}, value)
    }
    if isinstance(value, Mapping):
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                out |= _failing_rules(props[k], v)
    elif isinstance(value, list) and "items" in schema:
        for v in value:
            out |= _failing_rules(schema["items"], v)
    return out


# --- the same, with hostile and random values at every string field --------------------------------

HOSTILE = st.one_of(
    st.none(),  # YAML `field: ~`: pruned by the API server, so it must be by Validate() too
    st.text(max_size=40),
    st.text(alphabet="abc019.-_@/:%\"'{}; \n\t\\=,*#$", max_size=30),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "a" * 300,
            "x\n",
            "%any",
            "@x",
            "1.2.3.4\n",
            "0.0.0.0/0",
            "10.0.0.0/8 ",
            "web\x00",
            "ünïcödé",
            "${x}",
            "a;b",
            "}\nconnections {",
            "aes256-sha256-modp2048\n",
        ]
    ),
    st.from_regex(r"[a-z0-9][-a-z0-9.]{0,20}", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(/[0-9]{1,2})?", fullmatch=True),
)
FIELDS = [
    (GATEWAY, ["metadata", "name"]),
    (GATEWAY, ["spec", "serviceCIDR"]),
    (GATEWAY, ["spec", "type"]),
    (GATEWAY, ["spec", "exposures", 0, "name"]),
    (GATEWAY, ["spec", "exposures", 0, "target", "address"]),
    (GATEWAY, ["spec", "reverseExposures", 0, "name"]),
    (GATEWAY, ["spec", "ipsec", "localID"]),
    (GATEWAY, ["spec", "ipsec", "ike", "proposals", 0]),
    (GATEWAY, ["spec", "ipsec", "esp", "proposals", 0]),
    (GATEWAY, ["spec", "ipsec", "pskSecretRef", "key"]),
    (PEER, ["spec", "endpoint"]),
    (PEER, ["spec", "ipsec", "id"]),
    (PEER, ["spec", "ipsec", "remoteSubnets", 0]),
    (PEER, ["spec", "authorization", "exposures", 0]),
    (PEER, ["spec", "type"]),
    (WG_SITE, ["spec", "wireguard", "publicKey"]),
    (WG_SITE, ["spec", "wireguard", "allowedIPs", 0]),
    (LEGACY_GW, ["spec", "tunnels", 0, "name"]),
    (LEGACY_GW, ["spec", "tunnels", 0, "peer", "address"]),
    (LEGACY_GW, ["spec", "tunnels", 0, "mode"]),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=HOSTILE)
def test_admission_and_validate_agree_on_hostile_values(
    field: tuple[dict[str, Any], list[Any]], value: str | None
) -> None:
    base, path = field
    doc = mutate(base, path, value)
    assert admitted(doc) == (validate_object(doc) == [])
