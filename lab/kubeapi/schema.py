"""Custom resource admission against the CRD's structural openAPIV3Schema and its CEL rules.

In the order apiextensions-apiserver applies them: unknown fields are pruned (``fieldValidation=Strict``:
a 400 ``strict decoding error``; ``Warn`` or unset: a Warning header), nulls of non-nullable fields are
dropped, defaults are applied, then the value validations run with Kubernetes' paths and wording (type,
required, enum, pattern with RE2 semantics, minimum/maximum (exclusive), min/maxLength, min/maxItems,
min/maxProperties, format ipv4/cidr, x-kubernetes-list-type set/map uniqueness) and, only when those passed,
the ``x-kubernetes-validations`` CEL rules (cel-python, standard CEL: no Kubernetes CEL extension
libraries; ``oldSelf`` transition rules get the old value on update; ``messageExpression`` is not
evaluated; rules on values an update leaves unchanged are skipped, as CRD validation ratcheting does).
Not modelled: oneOf/anyOf/allOf/not, ratcheting of the non-CEL validations, CEL cost limits, other formats.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import celpy
import re2
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from lab.kubeapi.errors import FieldError, bad_request, invalid
from lab.kubeapi.resources import ResourceType

META_KEEP = ("apiVersion", "kind", "metadata")


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune(
    value: Any, schema: Mapping[str, Any] | None, path: str, unknown: list[str], root: bool = False
) -> Any:
    """Drop fields the schema does not declare (collecting their paths)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return value
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if root and k in META_KEEP:
                out[k] = v
            elif k in props:
                out[k] = prune(v, props[k], _join(path, k), unknown)
            elif isinstance(extra, Mapping):
                out[k] = prune(v, extra, _join(path, k), unknown)
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                out[k] = v
            else:
                unknown.append(_join(path, k))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [prune(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


def default(value: Any, schema: Mapping[str, Any] | None) -> None:
    """Null pruning and structural defaulting, in place (apiextensions' defaulting algorithm)."""
    if schema is None:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for k in list(value):
            sub = props.get(k)
            if value[k] is None and sub is not None and not sub.get("nullable"):
                if "default" in sub:
                    value[k] = json.loads(json.dumps(sub["default"]))
                else:
                    del value[k]
        for k, sub in props.items():
            if "default" in sub and k not in value:
                value[k] = json.loads(json.dumps(sub["default"]))
        for k, v in value.items():
            default(
                v,
                props.get(k)
                or (
                    schema.get("additionalProperties")
                    if isinstance(schema.get("additionalProperties"), Mapping)
                    else None
                ),
            )
    elif isinstance(value, list):
        for v in value:
            default(v, schema.get("items"))


def _quote_list(values: list[Any]) -> str:
    return ", ".join(json.dumps(v) for v in values)


def _go_map(value: Mapping[str, Any]) -> str:
    return (
        "map[string]interface {}{"
        + ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in value.items())
        + "}"
    )


def validate(value: Any, schema: Mapping[str, Any], path: str, errs: list[FieldError]) -> None:
    """The structural value validations at one node (and below)."""
    t = schema.get("type")
    actual = _type_of(value)
    if value is None:
        if not schema.get("nullable"):
            errs.append(
                FieldError(path, "Invalid value", f'{path} in body must be of type {t}: "null"', raw='"null"')
            )
        return
    if schema.get("x-kubernetes-int-or-string"):
        if actual not in ("integer", "string"):
            errs.append(
                FieldError(
                    path,
                    "Invalid value",
                    f"{path} in body must be of type integer,string: {json.dumps(actual)}",
                    raw=json.dumps(actual),
                )
            )
            return
    elif t and not (t == actual or (t == "number" and actual == "integer")):
        errs.append(
            FieldError(
                path,
                "Invalid value",
                f"{path} in body must be of type {t}: {json.dumps(actual)}",
                raw=json.dumps(actual),
            )
        )
        return
    if "enum" in schema and value not in schema["enum"]:
        errs.append(
            FieldError(
                path, "Unsupported value", f"supported values: {_quote_list(schema['enum'])}", value, True
            )
        )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errs.append(FieldError(path, "Too long", f"may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            errs.append(
                FieldError(
                    path,
                    "Invalid value",
                    f"{path} in body should be at least {schema['minLength']} chars long",
                    value,
                    True,
                )
            )
        if "pattern" in schema and re2.search(schema["pattern"], value) is None:
            errs.append(
                FieldError(
                    path, "Invalid value", f"{path} in body should match '{schema['pattern']}'", value, True
                )
            )
        fmt = schema.get("format")
        if fmt in ("ipv4", "cidr") and not _format_ok(fmt, value):
            errs.append(
                FieldError(
                    path,
                    "Invalid value",
                    f"{path} in body must be of type {fmt}: {json.dumps(value)}",
                    value,
                    True,
                )
            )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            lo = schema["minimum"]
            if value < lo or (schema.get("exclusiveMinimum") and value == lo):
                word = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                errs.append(
                    FieldError(path, "Invalid value", f"{path} in body should be {word} {lo}", value, True)
                )
        if "maximum" in schema:
            hi = schema["maximum"]
            if value > hi or (schema.get("exclusiveMaximum") and value == hi):
                word = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                errs.append(
                    FieldError(path, "Invalid value", f"{path} in body should be {word} {hi}", value, True)
                )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errs.append(
                FieldError(
                    path, "Too many", f"must have at most {schema['maxItems']} items", raw=str(len(value))
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            errs.append(
                FieldError(
                    path,
                    "Invalid value",
                    f"{path} in body should have at least {schema['minItems']} items",
                    raw=str(len(value)),
                )
            )
        kind = schema.get("x-kubernetes-list-type")
        if kind == "set":
            seen: list[Any] = []
            for i, v in enumerate(value):
                if v in seen:
                    errs.append(FieldError(f"{path}[{i}]", "Duplicate value", value=v, has_value=True))
                seen.append(v)
        elif kind == "map":
            keys = list(schema.get("x-kubernetes-list-map-keys") or [])
            seen_keys: list[tuple[Any, ...]] = []
            for i, v in enumerate(value):
                if isinstance(v, Mapping):
                    k = tuple(v.get(key) for key in keys)
                    if k in seen_keys:
                        errs.append(
                            FieldError(
                                f"{path}[{i}]",
                                "Duplicate value",
                                raw=_go_map({key: v.get(key) for key in keys}),
                            )
                        )
                    seen_keys.append(k)
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, v in enumerate(value):
                validate(v, items, f"{path}[{i}]", errs)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for r in schema.get("required") or []:
            if r not in value:
                errs.append(FieldError(_join(path, r), "Required value"))
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errs.append(
                FieldError(
                    path,
                    "Too many",
                    f"must have at most {schema['maxProperties']} items",
                    raw=str(len(value)),
                )
            )
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            errs.append(
                FieldError(
                    path,
                    "Invalid value",
                    f"{path} in body should have at least {schema['minProperties']} properties",
                    raw=str(len(value)),
                )
            )
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                validate(v, props[k], _join(path, k), errs)
            elif isinstance(extra, Mapping):
                validate(v, extra, _join(path, k), errs)


def _format_ok(fmt: str, value: str) -> bool:
    try:
        if fmt == "ipv4":
            ipaddress.IPv4Address(value)
        else:
            ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


_REASONS = {
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
}


def cel(
    value: Any, old: Any, schema: Mapping[str, Any], path: str, errs: list[FieldError], root: bool = False
) -> None:
    """Every x-kubernetes-validations rule at every schema location with a value, ratcheted: where an
    update leaves a value unchanged, its rules (and those below it) are not evaluated again."""
    if old is not None and old == value:
        return
    for r in schema.get("x-kubernetes-validations") or []:
        rule = r["rule"]
        if "oldSelf" in rule and old is None:
            continue  # a transition rule: only on update, where an old value exists
        self_value = value
        if root and isinstance(value, Mapping):
            meta = value.get("metadata") or {}
            self_value = {**value, "metadata": {k: meta[k] for k in ("name", "generateName") if k in meta}}
        activation = {"self": json_to_cel(self_value)}
        if old is not None:
            activation["oldSelf"] = json_to_cel(old)
        try:
            result = _program(rule).evaluate(activation)
            ok = isinstance(result, celpy.celtypes.BoolType) and bool(result)
            message = r.get("message") or f"failed rule: {rule}"
        except CELEvalError as e:
            ok, message = False, f"error evaluating rule: {e}"
        if not ok:
            field = _join(path, r["fieldPath"].lstrip(".")) if r.get("fieldPath") else path
            kind = _REASONS.get(r.get("reason", ""), "Invalid value")
            if kind == "Invalid value":
                errs.append(FieldError(field, kind, message, raw=json.dumps(schema.get("type", "object"))))
            else:
                errs.append(FieldError(field, kind, message))
    if isinstance(value, Mapping):
        props = schema.get("properties") or {}
        for k, v in value.items():
            if k in props:
                cel(v, old.get(k) if isinstance(old, Mapping) else None, props[k], _join(path, k), errs)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            cel(v, None, schema["items"], f"{path}[{i}]", errs)


def validator(
    rtype: ResourceType,
    version: str,
    obj: dict[str, Any],
    old: Mapping[str, Any] | None,
    field_validation: str,
) -> list[str]:
    """The store's admission hook for custom resources: prunes and defaults ``obj`` in place, returns
    warnings, raises 400 (strict unknown fields) or 422 (invalid)."""
    schema = (rtype.schemas or {}).get(version)
    if not schema:
        return []
    unknown: list[str] = []
    pruned = prune(obj, schema, "", unknown, root=True)
    warnings: list[str] = []
    if unknown:
        if field_validation == "Strict":
            listed = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise bad_request(
                f'{rtype.kind} in version "{version}" cannot be handled as a {rtype.kind}: strict '
                f"decoding error: {listed}"
            )
        if field_validation != "Ignore":
            warnings = [f'unknown field "{u}"' for u in unknown]
    if pruned is not obj:
        obj.clear()
        obj.update(pruned)
    default(obj, schema)
    errs: list[FieldError] = []
    body = {k: v for k, v in obj.items() if k not in META_KEEP}
    validate(
        body,
        {**schema, "required": [r for r in schema.get("required") or [] if r not in META_KEEP]},
        "",
        errs,
    )
    if not errs:
        old_body = {k: v for k, v in old.items() if k != "metadata"} if old is not None else None
        cel({**body, "metadata": obj.get("metadata", {})}, old_body, schema, "", errs, root=True)
    if errs:
        raise invalid(rtype, str((obj.get("metadata") or {}).get("name", "")), errs)
    return warnings
