"""Any JSON-like garbage at any place of a document gives problems, never a crash (pure, hypothesis)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.api.validate import InvalidInput, validate
from controller.plan.render import RenderOptions, render_documents

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
DOCS = {
    name: [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    for name in ("ipsec.yaml", "wireguard.yaml", "legacy-ipsecgateway.yaml")
}
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=JSON, example=st.sampled_from(sorted(DOCS)))
def test_garbage_anywhere_is_a_problem_never_a_crash(data: st.DataObject, value: Any, example: str) -> None:
    docs = copy.deepcopy(DOCS[example])
    i = data.draw(st.integers(0, len(docs) - 1))
    path = data.draw(st.sampled_from(paths(docs[i])))
    node: Any = docs[i]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    problems = validate(docs, ("192.0.2.64/26",))
    for p in problems:  # one line each, starting with the resource
        assert "\n" not in str(p) and str(p).startswith(f"{p.resource}: ")
    try:
        render_documents(docs, RenderOptions(internal_source_cidrs=("192.0.2.64/26",)))
    except InvalidInput as exc:
        assert exc.problems
