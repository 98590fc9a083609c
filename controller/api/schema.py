"""A small schema language: the ONE source of the per-object rules, read twice.

* ``check(node, value, path)`` walks a raw document (a dict from YAML) and returns every violation as a
  ``FieldError`` (field path, offending value, rule). ``controller.api.validate`` uses it.
* ``openapi(node)`` turns the same nodes into a Kubernetes ``openAPIV3Schema`` (types, enums, patterns,
  formats, bounds, list semantics, and ``x-kubernetes-validations`` CEL rules with messages).
  ``controller.api.crds`` uses it, so the API server rejects at admission what ``check`` rejects.

Each cross-field ``Rule`` carries its CEL text AND a Python twin (``holds``); tests evaluate both (schema
with ``jsonschema``, CEL with ``celpy``) against one corpus and prove they give the same verdict.

Semantics mirrored from the API server (and emulated the same way in the agreement test):

* patterns are matched against the WHOLE string (Go's RE2 ``^...$`` has no "before a trailing newline"
  exception, unlike Python's ``$``), so ``check`` uses ``re.fullmatch`` on the unanchored pattern;
* unknown fields are errors (kubectl's default strict server-side field validation);
* ``list_type="set"`` and ``list_type="map"`` reject duplicates (items / map keys);
* cross-field rules of an object are evaluated only when the object is otherwise well-formed;
* a JSON null for a known field counts as absent (or as its default): ``prune_nulls`` first.

Patterns avoid look-arounds and back-references: RE2 has neither.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, TypeAlias


@dataclass(frozen=True)
class FieldError:
    """One violation: ``path: "value" rule`` (value omitted when there is none, e.g. a missing field)."""

    path: str
    rule: str
    value: str | None = None
    reason: str = "FieldValueInvalid"
    """Kubernetes' cause type (FieldValueInvalid, FieldValueRequired, FieldValueDuplicate, ...)."""

    def __str__(self) -> str:
        return (
            f"{self.path}: {self.value} {self.rule}"
            if self.value is not None
            else f"{self.path}: {self.rule}"
        )


def show(value: Any, limit: int = 80) -> str:
    """A value as it appears in an error: JSON-quoted (newlines and quotes escaped), long ones cut."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str | int | float):
        text = str(value)
    elif isinstance(value, Mapping):
        return "(an object)"
    elif isinstance(value, list | tuple):
        return "(a list)"
    elif value is None:
        return "null"
    else:
        text = str(value)
    if len(text) > limit:
        text = f"{text[:limit]}...({len(text)} chars)"
    return json.dumps(text, ensure_ascii=True)


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the API server, ``holds`` for Python; both on the same object."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str = ""
    """Relative path the error is reported at (CEL ``fieldPath``), e.g. ``.ha.enabled``."""
    reason: str = "FieldValueInvalid"
    needs_valid: bool = True
    """Evaluate only when the object is otherwise well-formed (the Python twin may assume types)."""
    report_at: str | None = None
    """Where Python reports the error when it differs from ``field_path`` (which must name a schema field
    for the API server, e.g. ``metadata.name`` cannot be a fieldPath)."""


@dataclass(frozen=True)
class Str:
    description: str = ""
    pattern: str | None = None
    """Unanchored; matched against the whole value."""
    enum: tuple[str, ...] = ()
    format: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    rule: str = "is not valid"
    """What a pattern violation says, e.g. ``is not an IPv4 CIDR``."""
    default: str | None = None
    rules: tuple[Rule, ...] = ()
    """CEL rules on the string itself (``self`` is the string); checked after the pattern."""


@dataclass(frozen=True)
class Int:
    description: str = ""
    minimum: int | None = None
    maximum: int | None = None
    rule: str = ""
    """What a bound violation says; default: ``must be between MIN and MAX``."""


@dataclass(frozen=True)
class Bool:
    description: str = ""


@dataclass(frozen=True)
class Arr:
    items: Node
    description: str = ""
    min_items: int | None = None
    max_items: int | None = None
    list_type: Literal["atomic", "set", "map"] = "atomic"
    map_keys: tuple[str, ...] = ()
    """``list_type="map"``: the fields that together tell items apart (a field's default stands in for it
    when absent: the API server defaults before it validates)."""


@dataclass(frozen=True)
class Obj:
    fields: Mapping[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    description: str = ""
    preserve_unknown: bool = False


Node: TypeAlias = Str | Int | Bool | Arr | Obj


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def matches(node: Str, value: str) -> bool:
    return node.pattern is None or _compiled(node.pattern).fullmatch(value) is not None


def _key(key: Any) -> str:
    """An unknown field's name in a path: as is when it is a plain word, else JSON-quoted (one line)."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]{1,63}", text) else show(text)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- nulls, as the API server treats them ----------------------------------------------------------


def prune_nulls(node: Node, value: Any, path: str = "", pruned: list[str] | None = None) -> Any:
    """``value`` as the API server stores it before validating: a JSON null (YAML ``field: ~``) for a
    known field is REMOVED when the field has no default (none of our fields is ``nullable``) and
    REPLACED by the default when it has one. Nulls inside lists are kept (the API server keeps them, and
    then rejects them as type errors); nulls of unknown fields are kept (strict field validation rejects
    the field). This is apiextensions-apiserver's ``PruneNonNullableNullsWithoutDefaults`` followed by
    defaulting (Kubernetes docs, "Defaulting and Nullable"). ``value`` is never modified: a part with
    nothing to prune is returned as is, a changed one as a copy. ``pruned`` collects removed paths."""
    if not path and not _has_null(value):
        return value  # the common case, found by a cheap walk
    match node:
        case Obj() if isinstance(value, Mapping):
            out: dict[Any, Any] | None = None
            for key, item in value.items():
                sub = node.fields.get(key) if isinstance(key, str) else None
                if sub is None:
                    continue
                if item is None:
                    new: Any = sub.default if isinstance(sub, Str) else None
                    if new is None and pruned is not None:
                        pruned.append(_join(path, key))
                else:
                    new = prune_nulls(sub, item, _join(path, key), pruned)
                    if new is item:
                        continue
                if out is None:
                    out = dict(value)
                if new is None:
                    del out[key]
                else:
                    out[key] = new
            return value if out is None else out
        case Arr() if isinstance(value, list):
            items = [prune_nulls(node.items, item, f"{path}[{i}]", pruned) for i, item in enumerate(value)]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _has_null(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None:
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, Mapping):
            stack.extend(v.values())
    return False


# --- checking ---------------------------------------------------------------------------------------


def kind_of(value: Any) -> str:
    """The JSON type of a value. Type errors name it instead of echoing the value: a secret pasted inline
    where a reference belongs (``pskSecretRef: "<the key>"``) must not reach stderr, logs or conditions."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def check(node: Node, value: Any, path: str) -> list[FieldError]:
    """Every violation of ``node`` by ``value`` (a raw, JSON-like document)."""
    errors: list[FieldError] = []
    _check(node, value, path, errors)
    return errors


def _check(node: Node, value: Any, path: str, errors: list[FieldError]) -> None:
    match node:
        case Str():
            if not isinstance(value, str):
                errors.append(
                    FieldError(
                        path, f"must be a string (got {kind_of(value)})", None, "FieldValueTypeInvalid"
                    )
                )
            elif node.enum and value not in node.enum:
                errors.append(
                    FieldError(
                        path, f"is not one of: {', '.join(node.enum)}", show(value), "FieldValueNotSupported"
                    )
                )
            elif not matches(node, value):  # the rule says more than a length would
                errors.append(FieldError(path, node.rule, show(value)))
            elif node.min_length is not None and len(value) < node.min_length:
                errors.append(FieldError(path, f"must be at least {node.min_length} characters", show(value)))
            elif node.max_length is not None and len(value) > node.max_length:
                errors.append(
                    FieldError(
                        path,
                        f"must be at most {node.max_length} characters",
                        show(value),
                        "FieldValueTooLong",
                    )
                )
            else:
                for rule in node.rules:
                    if not rule.holds(value):
                        errors.append(FieldError(path, rule.message, show(value), rule.reason))
        case Bool():
            if not isinstance(value, bool):
                errors.append(
                    FieldError(
                        path, f"must be a boolean (got {kind_of(value)})", None, "FieldValueTypeInvalid"
                    )
                )
        case Int():
            if not isinstance(value, int) or isinstance(value, bool):
                errors.append(
                    FieldError(
                        path, f"must be an integer (got {kind_of(value)})", None, "FieldValueTypeInvalid"
                    )
                )
            elif (node.minimum is not None and value < node.minimum) or (
                node.maximum is not None and value > node.maximum
            ):
                errors.append(
                    FieldError(
                        path, node.rule or f"must be between {node.minimum} and {node.maximum}", show(value)
                    )
                )
        case Arr():
            if not isinstance(value, list):
                errors.append(
                    FieldError(path, f"must be a list (got {kind_of(value)})", None, "FieldValueTypeInvalid")
                )
                return
            if node.min_items is not None and len(value) < node.min_items:
                errors.append(
                    FieldError(
                        path, f"must have at least {node.min_items} item(s)", None, "FieldValueRequired"
                    )
                )
            if node.max_items is not None and len(value) > node.max_items:
                errors.append(
                    FieldError(path, f"must have at most {node.max_items} items", None, "FieldValueTooMany")
                )
                return  # the API server stops here too; don't flood with per-item errors
            before = len(errors)
            for i, item in enumerate(value):
                _check(node.items, item, f"{path}[{i}]", errors)
            if len(errors) == before:
                _duplicates(node, value, path, errors)
        case Obj():
            if not isinstance(value, Mapping):
                errors.append(
                    FieldError(
                        path, f"must be an object (got {kind_of(value)})", None, "FieldValueTypeInvalid"
                    )
                )
                return
            before = len(errors)
            if not node.preserve_unknown:
                for key in value:
                    if key not in node.fields:
                        errors.append(
                            FieldError(
                                _join(path, _key(key)), "is not a known field", None, "FieldValueForbidden"
                            )
                        )
            for key in node.required:
                if key not in value:
                    errors.append(FieldError(_join(path, key), "is required", None, "FieldValueRequired"))
            for key, sub in node.fields.items():
                if key in value:
                    _check(sub, value[key], _join(path, key), errors)
            valid = len(errors) == before
            for rule in node.rules:
                if (valid or not rule.needs_valid) and not rule.holds(value):
                    errors.append(_rule_error(rule, value, path))


def _duplicates(node: Arr, value: list[Any], path: str, errors: list[FieldError]) -> None:
    if node.list_type == "atomic":
        return
    seen: set[Any] = set()
    fields = node.items.fields if isinstance(node.items, Obj) else {}
    for i, item in enumerate(value):
        if node.list_type == "set":
            key, sub, shown = item, f"{path}[{i}]", show(item)
        else:
            key = tuple(item.get(k, getattr(fields.get(k), "default", None)) for k in node.map_keys)
            sub = f"{path}[{i}].{node.map_keys[0]}" if len(node.map_keys) == 1 else f"{path}[{i}]"
            shown = show(key[0]) if len(key) == 1 else show("/".join(map(str, key)))
        if key in seen:
            errors.append(FieldError(sub, "is a duplicate", shown, "FieldValueDuplicate"))
        seen.add(key)


def _rule_error(rule: Rule, obj: Mapping[str, Any], path: str) -> FieldError:
    rel = rule.report_at if rule.report_at is not None else rule.field_path
    at = path + rel if path else rel.lstrip(".")
    value: Any = obj
    for part in rel.strip(".").split(".") if rel else []:
        value = value.get(part) if isinstance(value, Mapping) else None
    shown = show(value) if isinstance(value, str | int | bool) and rel else None
    return FieldError(at, rule.message, shown, rule.reason)


# --- OpenAPI ----------------------------------------------------------------------------------------


def openapi(node: Node) -> dict[str, Any]:
    """The Kubernetes structural-schema form of ``node``."""
    out: dict[str, Any] = {}
    match node:
        case Str():
            out["type"] = "string"
            if node.description:
                out["description"] = node.description
            if node.enum:
                out["enum"] = list(node.enum)
            if node.pattern is not None:
                out["pattern"] = f"^{node.pattern}$"
            if node.format:
                out["format"] = node.format
            if node.min_length is not None:
                out["minLength"] = node.min_length
            if node.max_length is not None:
                out["maxLength"] = node.max_length
            if node.default is not None:
                out["default"] = node.default
            if node.rules:
                out["x-kubernetes-validations"] = _cel(node.rules)
        case Int():
            out["type"] = "integer"
            if node.description:
                out["description"] = node.description
            if node.minimum is not None:
                out["minimum"] = node.minimum
            if node.maximum is not None:
                out["maximum"] = node.maximum
        case Bool():
            out["type"] = "boolean"
            if node.description:
                out["description"] = node.description
        case Arr():
            out["type"] = "array"
            if node.description:
                out["description"] = node.description
            out["items"] = openapi(node.items)
            if node.min_items is not None:
                out["minItems"] = node.min_items
            if node.max_items is not None:
                out["maxItems"] = node.max_items
            out["x-kubernetes-list-type"] = node.list_type
            if node.list_type == "map":
                out["x-kubernetes-list-map-keys"] = list(node.map_keys)
        case Obj():
            out["type"] = "object"
            if node.description:
                out["description"] = node.description
            if node.fields:
                out["properties"] = {k: openapi(v) for k, v in node.fields.items()}
            if node.required:
                out["required"] = list(node.required)
            if node.preserve_unknown:
                out["x-kubernetes-preserve-unknown-fields"] = True
            if node.rules:
                out["x-kubernetes-validations"] = _cel(node.rules)
    return out


def _cel(rules: tuple[Rule, ...]) -> list[dict[str, Any]]:
    out = []
    for r in rules:
        rule: dict[str, Any] = {"rule": r.cel, "message": r.message, "reason": r.reason}
        if r.field_path:
            rule["fieldPath"] = r.field_path
        out.append(rule)
    return out
