"""Label and field selectors, parsed and matched as k8s.io/apimachinery's labels/fields packages do (pure).

Label selector grammar: comma-separated requirements ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, ``k`` (exists), ``!k`` (does not exist), ``k>N``/``k<N``. ``!=`` and ``notin`` also
match objects that lack the key. Field selectors: ``f=v``, ``f==v``, ``f!=v``, on metadata.name,
metadata.namespace and the per-kind fields the real server registers (``ResourceType.field_selectors``);
any other field is a 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lab.kubeapi.errors import bad_request
from lab.kubeapi.resources import ResourceType

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "=" | "in":
                return has and value in self.values
            case "!=" | "notin":
                return not has or value not in self.values
            case "exists":
                return has
            case "!":
                return not has
            case "gt" | "lt":
                try:
                    v, bound = int(value or ""), int(self.values[0])
                except ValueError:
                    return False
                return v > bound if self.op == "gt" else v < bound
        return False


LabelSelector = tuple[Requirement, ...]


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _check_key(key: str) -> None:
    if not _KEY.match(key) or len(key.rpartition("/")[2]) > 63:
        raise bad_request(
            f"unable to parse requirement: {key!r}: name part must consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character"
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise bad_request(
            f'unable to parse requirement: values[0][{value}]: Invalid value: "{value}": a valid '
            "label must be "
            "an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        )


_SET = re.compile(r"^(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)$")
_EQ = re.compile(r"^(?P<key>[^\s!=<>()]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<val>[^\s!=<>(),]*)$")


def parse_labels(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value; raise a 400 ApiError when it is malformed."""
    if not text:
        return ()
    reqs: list[Requirement] = []
    for part in _split_top(text):
        if m := _SET.match(part):
            vals = tuple(v.strip() for v in m["vals"].split(",") if v.strip())
            _check_key(m["key"])
            for v in vals:
                _check_value(v)
            reqs.append(Requirement(m["key"], m["op"], vals))
        elif m := _EQ.match(part):
            op = {"==": "=", ">": "gt", "<": "lt"}.get(m["op"], m["op"])
            _check_key(m["key"])
            if op in ("gt", "lt") and not m["val"].isdigit():
                raise bad_request(
                    "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an "
                    f"integer: {part}"
                )
            if op not in ("gt", "lt"):
                _check_value(m["val"])
            reqs.append(Requirement(m["key"], op, (m["val"],)))
        elif part.startswith("!"):
            key = part[1:].strip()
            _check_key(key)
            reqs.append(Requirement(key, "!"))
        elif re.match(r"^[^\s!=<>(),]+$", part):
            _check_key(part)
            reqs.append(Requirement(part, "exists"))
        else:
            raise bad_request(
                f"unable to parse requirement: found '{part}', expected: in, notin, =, ==, !=, gt, lt"
            )
    return tuple(reqs)


def match_labels(selector: LabelSelector, obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in selector)


def selector_from_label_selector(ls: Mapping[str, Any] | None) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels/matchExpressions) as requirements (for PDBs, tables, ...)."""
    if not ls:
        return ()
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (ls.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for e in ls.get("matchExpressions") or []:
        reqs.append(Requirement(e["key"], ops.get(e.get("operator", ""), "in"), tuple(e.get("values") or ())))
    return tuple(reqs)


def format_label_selector(ls: Mapping[str, Any] | None) -> str:
    """metav1.FormatLabelSelector: ``a=b,c in (d)``; ``<none>`` when empty."""
    if not ls:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((ls.get("matchLabels") or {}).items())]
    for e in ls.get("matchExpressions") or []:
        op = e.get("operator", "")
        vals = ",".join(e.get("values") or [])
        if op == "Exists":
            parts.append(e["key"])
        elif op == "DoesNotExist":
            parts.append("!" + e["key"])
        else:
            parts.append(f"{e['key']} {op.lower()} ({vals})")
    return ",".join(parts) or "<none>"


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negate: bool


FieldSelector = tuple[FieldTerm, ...]


def parse_fields(text: str | None, rtype: ResourceType) -> FieldSelector:
    """Parse a ``fieldSelector``; an unknown field is a 400 in the wording of the real server."""
    if not text:
        return ()
    terms: list[FieldTerm] = []
    for part in (p for p in text.split(",") if p.strip()):
        if "!=" in part:
            f, _, v = part.partition("!=")
            neg = True
        elif "==" in part:
            f, _, v = part.partition("==")
            neg = False
        elif "=" in part:
            f, _, v = part.partition("=")
            neg = False
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        f = f.strip()
        if f not in ("metadata.name", "metadata.namespace") and f not in rtype.field_selectors:
            if rtype.field_selectors:
                raise bad_request(f"field label not supported: {f}")
            raise bad_request(
                f'"{f}" is not a known field selector: only "metadata.name", "metadata.namespace"'
            )
        terms.append(FieldTerm(f, v.strip(), neg))
    return tuple(terms)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if path == "source" and isinstance(cur, Mapping):
        return str(cur.get("component", ""))
    return str(cur)


def field_getter(rtype: ResourceType) -> Callable[[Mapping[str, Any], str], str]:
    selectable = dict(rtype.selectable_fields)

    def get(obj: Mapping[str, Any], f: str) -> str:
        if f in selectable:
            return _field_value(obj, selectable[f].lstrip("."))
        if f == "spec.unschedulable" or f == "spec.hostNetwork":
            return _field_value(obj, f) or "false"
        return _field_value(obj, f)

    return get


def match_fields(selector: FieldSelector, obj: Mapping[str, Any], rtype: ResourceType) -> bool:
    if not selector:
        return True
    get = field_getter(rtype)
    for t in selector:
        v = get(obj, t.field)
        if (v == t.value) == t.negate:
            return False
    return True


def name_from_fields(selector: FieldSelector) -> str:
    """The name a ``metadata.name=X`` field selector pins (RBAC resourceNames on list/watch)."""
    for t in selector:
        if t.field == "metadata.name" and not t.negate:
            return t.value
    return ""
