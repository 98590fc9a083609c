"""The tests poll through ``lab.wait`` (``wait_for`` / ``wait_for_async``): one deadline semantics, a final
check after the deadline, and a failure that names what was awaited. A hand-written ``while`` + sleep loop
gets one of these wrong sooner or later (one ran on silently when its time was up), so none may appear in
tests/ except the deliberate ones listed in ALLOWED, each with why it is not a wait.

Found by reading the sources (ast): a ``while`` loop whose body calls a sleep (``time.sleep``,
``anyio.sleep``, ``asyncio.sleep``, ``trio.sleep`` or an imported ``sleep``), and the same loop disguised as
``for _ in itertools.count()`` / ``range(n)`` that sleeps and breaks or returns."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

SLEEPS = frozenset({"time.sleep", "anyio.sleep", "asyncio.sleep", "trio.sleep", "sleep"})
COUNTERS = frozenset({"itertools.count", "count", "range"})

ALLOWED: dict[tuple[str, str], str] = {
    (
        "tests/component/test_httpd_flood.py",
        "test_a_slow_but_steady_reader_gets_the_whole_reply",
    ): "the sleep is the slow reader under test (it paces the reads), not a wait",
    (
        "tests/component/test_vici_relay.py",
        "FakeCharon.serve",
    ): "a fake charon answering each request after the delay the test injects",
    (
        "tests/integration/test_agent_ipsec.py",
        "test_child_rekey_never_shows_zero_bytes_or_a_non_established_state",
    ): "a sampling window: 26 s of samples across child rekeys, every one checked",
    (
        "tests/integration/test_exporter_lab.py",
        "test_bytes_never_decrease_across_child_rekeys_while_traffic_flows",
    ): "a sampling window: 30 s of scrapes across child rekeys, every one checked",
    (
        "tests/integration/test_initnat_ha_role.py",
        "test_a_plan_gaining_ha_on_a_serving_pod_never_stands_by_and_a_missing_file_under_ha_does.sample",
    ): "a sampling window: init-nat's rules read every 10 ms while a plan gains ha, every sample checked",
}
"""(file, function) -> why its loop with a sleep is not a poll for lab.wait."""


def _sleeps(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) in SLEEPS for n in ast.walk(node))


def _polls(loop: ast.stmt) -> bool:
    if isinstance(loop, ast.While):
        return _sleeps(loop)
    if isinstance(loop, ast.For | ast.AsyncFor):
        counted = isinstance(loop.iter, ast.Call) and ast.unparse(loop.iter.func) in COUNTERS
        leaves = any(isinstance(n, ast.Break | ast.Return) for n in ast.walk(loop))
        return counted and leaves and _sleeps(loop)
    return False


def polling_loops(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function's qualified name) of every polling loop in ``source``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = (*scope, child.name)
            if isinstance(child, ast.stmt) and _polls(child):
                found.append((child.lineno, ".".join(scope) or "<module>"))
            visit(child, inner)

    visit(ast.parse(source), ())
    return found


def scan() -> dict[tuple[str, str], list[int]]:
    """(file relative to the repository, function) -> lines of its polling loops, over tests/**/*.py."""
    loops: dict[tuple[str, str], list[int]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for line, function in polling_loops(path.read_text()):
            loops.setdefault((rel, function), []).append(line)
    return loops


def test_no_test_polls_by_hand_outside_the_allow_list() -> None:
    stray = [
        f"{file}:{line} ({function}): a while + sleep loop; use lab.wait.wait_for / wait_for_async"
        for (file, function), lines in scan().items()
        if (file, function) not in ALLOWED
        for line in lines
    ]
    assert not stray, "\n".join(stray)


def test_every_allowed_loop_is_still_there() -> None:
    """An entry whose loop went away is removed, so that the list does not grow a free pass."""
    loops = scan()
    gone = [
        f"{file} ({function}): {why}"
        for (file, function), why in ALLOWED.items()
        if (file, function) not in loops
    ]
    assert not gone, "\n".join(gone)


@pytest.mark.parametrize(
    "source, found",
    [
        pytest.param(
            "import time\ndef f(x):\n    while not x():\n        time.sleep(0.1)\n",
            [(3, "f")],
            id="time.sleep",
        ),
        pytest.param(
            "async def f(x):\n    while True:\n        if await x():\n            return\n"
            "        await anyio.sleep(0.1)\n",
            [(2, "f")],
            id="anyio.sleep",
        ),
        pytest.param(
            "class C:\n    async def m(self):\n        while True:\n            await asyncio.sleep(1)\n",
            [(3, "C.m")],
            id="asyncio.sleep-in-a-method",
        ),
        pytest.param(
            "from time import sleep\nwhile not ready():\n    sleep(1)\n",
            [(2, "<module>")],
            id="imported-sleep",
        ),
        pytest.param(
            "async def f(x):\n    for _ in itertools.count():\n        if await x():\n            break\n"
            "        await anyio.sleep(0.02)\n",
            [(2, "f")],
            id="for-count",
        ),
        pytest.param(
            "def f(x):\n    for _ in range(100):\n        if x():\n            return\n"
            "        time.sleep(0.1)\n",
            [(2, "f")],
            id="for-range",
        ),
        pytest.param("def f(q):\n    while q:\n        q.pop()\n", [], id="no-sleep"),
        pytest.param(
            "def f(steps):\n    for s in steps:\n        go(s)\n        time.sleep(1)\n", [], id="fixed-steps"
        ),
        pytest.param("def f(e):\n    while not e.is_set():\n        e.wait(0.1)\n", [], id="not-a-sleep"),
    ],
)
def test_the_scan_finds_polling_loops_and_only_those(source: str, found: list[tuple[int, str]]) -> None:
    assert polling_loops(source) == found
