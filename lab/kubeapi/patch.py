"""The four patch formats of the Kubernetes API (pure functions on JSON values).

* JSON merge patch (RFC 7386): exact.
* JSON patch (RFC 6902): exact, incl. ``test``; failures raise :class:`PatchError` with evanphx/json-patch's
  wording (the API server answers them with a generic 422).
* Strategic merge patch: an APPROXIMATION. Lists named in :data:`MERGE_KEYS` are merged by their merge key
  (containers by name, env by name, ports by containerPort, volumes by name, volumeMounts by mountPath,
  conditions by type, ownerReferences by uid, ...) and ``metadata.finalizers`` is a merged set; every other
  list is replaced whole (as lists without a patchStrategy are). Directives: ``$patch: replace|delete|merge``
  (maps and list items), ``$retainKeys``, ``$setElementOrder/<list>``, ``$deleteFromPrimitiveList/<list>``,
  and null deletes a key. The real server looks merge keys up per Go struct field; this table is keyed by
  field name only (the contexts where one name has two keys, container vs service ``ports``, are handled).
* Server-side apply: an APPROXIMATION without managedFields. The last configuration each field manager applied
  is remembered; a re-apply removes the fields that manager applied before and no longer applies, then merges
  the new configuration (associative lists by merge key or x-kubernetes-list-map-keys, set lists as sets,
  other lists atomically). Ownership conflicts between managers are never reported (force is accepted).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


class PatchError(Exception):
    """The patch does not apply to the document."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid path: {path!r}")
    return [_unescape(t) for t in path[1:].split("/")]


def _index(part: str, length: int, allow_end: bool, path: str) -> int:
    if part == "-" and allow_end:
        return length
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"Unable to access invalid index: {part}: invalid index referenced")
    i = int(part)
    if i > length or (i == length and not allow_end):
        raise PatchError(f"Unable to access invalid index: {i}: invalid index referenced")
    return i


def _parent(doc: Any, tokens: list[str], op: str, path: str) -> Any:
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict) and t in cur:
            cur = cur[t]
        elif isinstance(cur, list) and t.isdigit() and int(t) < len(cur):
            cur = cur[int(t)]
        else:
            raise PatchError(f"{op} operation does not apply: doc is missing path: {path!r}: missing value")
    return cur


def _get(doc: Any, path: str, op: str) -> Any:
    cur = doc
    for t in _split(path):
        if isinstance(cur, dict) and t in cur:
            cur = cur[t]
        elif isinstance(cur, list) and t.isdigit() and int(t) < len(cur):
            cur = cur[int(t)]
        else:
            raise PatchError(f"{op} operation does not apply: doc is missing path: {path!r}: missing value")
    return cur


def _add(doc: Any, path: str, value: Any, op: str = "add") -> Any:
    tokens = _split(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), True, path), value)
    else:
        raise PatchError(f"{op} operation does not apply: doc is missing path: {path!r}: missing value")
    return doc


def _remove(doc: Any, path: str, op: str = "remove") -> Any:
    tokens = _split(path)
    if not tokens:
        raise PatchError(f"{op} operation does not apply: doc is missing path: {path!r}: missing value")
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent), False, path)]
    else:
        raise PatchError(f"{op} operation does not apply: doc is missing path: {path!r}: missing value")
    return doc


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1 (Python's == says otherwise)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a deep copy of ``doc``."""
    if not isinstance(ops, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    out = copy.deepcopy(doc)
    for raw in ops:
        if not isinstance(raw, Mapping) or "op" not in raw:
            raise PatchError("Unexpected kind: unknown")
        op, path = raw["op"], raw.get("path", "")
        if not isinstance(path, str):
            raise PatchError(f"{op} operation does not apply: invalid path")
        if op == "add":
            out = _add(out, path, copy.deepcopy(raw.get("value")))
        elif op == "remove":
            out = _remove(out, path)
        elif op == "replace":
            tokens = _split(path)
            if tokens:
                parent = _parent(out, tokens, op, path)
                last = tokens[-1]
                if isinstance(parent, dict):
                    if last not in parent:
                        raise PatchError(
                            f"replace operation does not apply: doc is missing key: {path}: missing value"
                        )
                    parent[last] = copy.deepcopy(raw.get("value"))
                elif isinstance(parent, list):
                    parent[_index(last, len(parent), False, path)] = copy.deepcopy(raw.get("value"))
                else:
                    raise PatchError(
                        f"replace operation does not apply: doc is missing key: {path}: missing value"
                    )
            else:
                out = copy.deepcopy(raw.get("value"))
        elif op == "move":
            frm = raw.get("from", "")
            value = _get(out, frm, "move")
            out = _remove(out, frm, "move")
            out = _add(out, path, value, "move")
        elif op == "copy":
            value = copy.deepcopy(_get(out, raw.get("from", ""), "copy"))
            out = _add(out, path, value, "copy")
        elif op == "test":
            try:
                actual = _get(out, path, "test")
            except PatchError:
                if raw.get("value") is None:
                    continue
                raise PatchError(f"testing value {path} failed: test failed") from None
            if not json_equal(actual, raw.get("value")):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {op}")
    return out


# --- strategic merge patch -------------------------------------------------------------------------

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "ephemeralContainerStatuses": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "addresses": "type",
    "taints": "key",
    "schedulingGates": "name",
    "readinessGates": "conditionType",
}
"""Lists merged by key in strategic merge patches (the patchMergeKey of the Go types)."""

MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})
"""Lists of scalars with patchStrategy merge (``metadata.finalizers``)."""


def merge_key(parent_path: Sequence[str], name: str) -> str | None:
    """The merge key of list ``name`` under ``parent_path`` (None: replace the list whole)."""
    if name == "ports":
        # container ports merge on containerPort; a Service's on port
        return "containerPort" if "containers" in parent_path or "initContainers" in parent_path else "port"
    if name == "addresses" and "status" not in parent_path:
        return None
    return MERGE_KEYS.get(name)


def strategic_merge(original: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Apply a strategic merge patch to a JSON document (see the module docstring for what is modelled)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    out: dict[str, Any] = copy.deepcopy(dict(original)) if isinstance(original, Mapping) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = list(v or [])
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            name = k.split("/", 1)[1]
            if isinstance(out.get(name), list):
                out[name] = [x for x in out[name] if x not in (v or [])]
            continue
        if v is None:
            out.pop(k, None)
            continue
        if isinstance(v, list):
            key = merge_key(path, k)
            if key is not None:
                out[k] = _merge_list(out.get(k), v, key, (*path, k))
            elif k in MERGED_PRIMITIVE_LISTS:
                cur = list(out.get(k) or [])
                out[k] = cur + [x for x in v if x not in cur]
            elif v and isinstance(v[0], Mapping) and v[0].get("$patch") == "replace":
                out[k] = [copy.deepcopy(x) for x in v[1:]]
            else:
                out[k] = copy.deepcopy(v)
            continue
        if isinstance(v, Mapping):
            merged = strategic_merge(out.get(k), v, (*path, k))
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
            continue
        out[k] = copy.deepcopy(v)
    for name, order in orders.items():
        if isinstance(out.get(name), list):
            out[name] = _order(out[name], order, merge_key(path, name))
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current: Any, patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    items: list[Any] = copy.deepcopy(list(current)) if isinstance(current, list) else []
    if patch and isinstance(patch[0], Mapping) and patch[0].get("$patch") == "replace":
        return [copy.deepcopy(x) for x in patch[1:]]
    for p in patch:
        if not isinstance(p, Mapping):
            if p not in items:
                items.append(copy.deepcopy(p))
            continue
        idx = next(
            (
                i
                for i, x in enumerate(items)
                if isinstance(x, Mapping) and key in p and x.get(key) == p.get(key)
            ),
            None,
        )
        if p.get("$patch") == "delete":
            if idx is not None:
                del items[idx]
            continue
        if idx is None:
            items.append(strategic_merge({}, p, path))
        else:
            items[idx] = strategic_merge(items[idx], p, path)
    return items


def _order(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(x: Any) -> Any:
        return x.get(key) if key and isinstance(x, Mapping) else x

    wanted = [ident(o) for o in order]
    ranked = [x for w in wanted for x in items if ident(x) == w]
    rest = [x for x in items if ident(x) not in wanted]
    return ranked + rest


# --- server-side apply (approximation) ------------------------------------------------------------


def _list_key(schema: Mapping[str, Any] | None, path: tuple[str, ...], name: str) -> tuple[str, ...] | None:
    if schema is not None:
        if schema.get("x-kubernetes-list-type") == "map":
            return tuple(schema.get("x-kubernetes-list-map-keys") or ())
        if schema.get("x-kubernetes-list-type") in ("atomic", "set"):
            return None
    key = merge_key(path, name)
    return (key,) if key else None


def _sub(schema: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties") or {}
    if name in props:
        return props[name]  # type: ignore[no-any-return]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def apply_merge(
    live: Any,
    config: Any,
    previous: Any,
    schema: Mapping[str, Any] | None = None,
    path: tuple[str, ...] = (),
) -> Any:
    """Merge an applied configuration into the live object, dropping what this manager applied before and
    no longer applies."""
    if not isinstance(config, Mapping):
        return copy.deepcopy(config)
    out: dict[str, Any] = copy.deepcopy(dict(live)) if isinstance(live, Mapping) else {}
    prev = previous if isinstance(previous, Mapping) else {}
    for k in prev:
        if k not in config:
            out.pop(k, None)
    for k, v in config.items():
        sub = _sub(schema, k)
        if isinstance(v, Mapping):
            out[k] = apply_merge(out.get(k), v, prev.get(k), sub, (*path, k))
        elif isinstance(v, list):
            keys = _list_key(sub, path, k)
            is_set = sub is not None and sub.get("x-kubernetes-list-type") == "set"
            if keys and all(isinstance(x, Mapping) for x in v):
                out[k] = _apply_list(out.get(k), v, prev.get(k), keys, (sub or {}).get("items"), (*path, k))
            elif is_set or k in MERGED_PRIMITIVE_LISTS:
                prev_items: list[Any] = prev[k] if isinstance(prev.get(k), list) else []
                cur = [x for x in (out.get(k) or []) if x in v or x not in prev_items]
                out[k] = cur + [x for x in v if x not in cur]
            else:
                out[k] = copy.deepcopy(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _apply_list(
    live: Any,
    config: list[Any],
    previous: Any,
    keys: tuple[str, ...],
    item_schema: Mapping[str, Any] | None,
    path: tuple[str, ...],
) -> list[Any]:
    def ident(x: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(x.get(k) for k in keys)

    items: list[Any] = copy.deepcopy(list(live)) if isinstance(live, list) else []
    prev = {ident(x): x for x in (previous or []) if isinstance(x, Mapping)}
    wanted = {ident(x) for x in config}
    items = [x for x in items if not (isinstance(x, Mapping) and ident(x) in prev and ident(x) not in wanted)]
    for c in config:
        idx = next((i for i, x in enumerate(items) if isinstance(x, Mapping) and ident(x) == ident(c)), None)
        if idx is None:
            items.append(copy.deepcopy(c))
        else:
            items[idx] = apply_merge(items[idx], c, prev.get(ident(c)), item_schema, path)
    return items
