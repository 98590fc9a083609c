"""The example custom resources in docs/examples, and small helpers to derive test cases from them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
DELETE = object()
"""A ``mutate`` value that removes the field instead of setting it."""


def example_docs(name: str) -> list[dict[str, Any]]:
    """The YAML documents of ``docs/examples/<name>``."""
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def mutate(doc: dict[str, Any], path: Sequence[str | int], value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with the field at ``path`` set to ``value`` (or removed: DELETE)."""
    out = copy.deepcopy(doc)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def edit(
    documents: list[dict[str, Any]], i: int, path: Sequence[str | int], value: Any
) -> list[dict[str, Any]]:
    """A deep copy of ``documents`` whose ``i``-th document has ``path`` set to ``value``."""
    out = copy.deepcopy(documents)
    out[i] = mutate(out[i], path, value)
    return out
