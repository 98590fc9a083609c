"""No hand-written polling loop in the lab or the benches: a wait goes through ``lab.wait`` (one helper: a
deadline, a final check after it, a failure that says what was awaited and what was last seen).

An AST scan of ``lab/**/*.py`` and ``bench/*.py`` for ``while`` loops whose own body (not a nested loop's
or function's) calls a ``sleep`` (``time.sleep``, ``anyio.sleep``, ``asyncio.sleep``, ``sleep_until``...)
or a ``pause`` (the demo's sleep that pumps its output).
Waiting on an event with a timeout (``Event.wait(timeout)``, ``move_on_after``) is not sleeping and is fine.
The deliberate ones (daemons' main loops, sampling windows, paced schedules) are listed in ``ALLOWED`` with
the reason; each is also marked by a comment at the loop. Reads files only (the unit tier: no processes, no
sockets).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HELPER = "lab/wait.py"
"""The one polling helper: its loops are the polling."""

ALLOWED: dict[tuple[str, str], str] = {
    ("lab/controlplane/cli.py", "up"): "the supervisor's main loop: watches its components until one dies",
    ("lab/demo.py", "Demo.pause"): "a fixed pause that keeps pumping the demo's output, no condition",
    ("lab/demo.py", "_demo"): "the demo's main loop: tables and kills on a schedule until Ctrl-C",
    (
        "lab/kubeapi/server.py",
        "ApiServer.gc_loop",
    ): "the garbage collector's loop (the sleep lets requests answer first)",
    (
        "lab/kubeapi/server.py",
        "ApiServer._watch",
    ): "a half-open watch holds, with no deadline by design, until the client gives up",
    (
        "lab/kubelet/cache.py",
        "Cache.run",
    ): "the informer's list-and-watch loop, relisting with a back-off forever",
    (
        "lab/kubelet/pod.py",
        "PodWorker._with_retry",
    ): "a kubelet retries a pod's set-up step forever, with a back-off",
    ("lab/kubelet/pod.py", "PodWorker._refresh_volumes"): "the kubelet's periodic volume sync",
    ("lab/kubelet/pod.py", "PodWorker._supervise"): "the container's restart loop with CrashLoopBackOff",
    ("lab/kubelet/pod.py", "PodWorker._probe_loop"): "a probe's period",
    (
        "lab/kubelet/pod.py",
        "PodWorker._status_writer",
    ): "the status writer's loop (its sleeps coalesce and back off)",
    ("bench/bench_status_writes.py", "main"): "a paced load schedule: one edit every interval in the window",
    (
        "bench/bench_status_writes.py",
        "serve_writers.main",
    ): "a paced load schedule: status writes at a fixed rate",
}

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _calls_sleep(node: ast.AST) -> bool:
    """Whether ``node``'s own code (not a nested loop's, function's or class's) calls a ``sleep*`` or a
    ``pause``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.While, *_SCOPES)):
            continue
        if isinstance(child, ast.Call):
            fn = child.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name.startswith("sleep") or name == "pause":
                return True
        if _calls_sleep(child):
            return True
    return False


def polling_loops(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, enclosing function's dotted name) of every ``while`` whose own body sleeps."""

    def visit(node: ast.AST, scope: tuple[str, ...]) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = (*scope, child.name)
            elif isinstance(child, ast.While) and _calls_sleep(child):
                yield child.lineno, ".".join(scope) or "<module>"
            yield from visit(child, inner)

    yield from visit(tree, ())


def sources() -> list[Path]:
    files = sorted({*ROOT.glob("lab/**/*.py"), *ROOT.glob("bench/*.py")})
    return [f for f in files if f.relative_to(ROOT).as_posix() != HELPER]


def found() -> dict[tuple[str, str], list[int]]:
    loops: dict[tuple[str, str], list[int]] = {}
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, func in polling_loops(ast.parse(path.read_text(), filename=rel)):
            loops.setdefault((rel, func), []).append(line)
    return loops


def test_no_hand_written_polling_loop_outside_lab_wait() -> None:
    loops = found()
    bad = [
        f"{rel}:{line} (in {func})"
        for (rel, func), lines in loops.items()
        if (rel, func) not in ALLOWED
        for line in lines
    ]
    assert not bad, (
        "a while loop that sleeps and polls: wait with lab.wait.wait_for / wait_for_async instead "
        "(or, for a daemon's main loop or a deliberate sampling window, add it to ALLOWED with why):\n  "
        + "\n  ".join(bad)
    )


def test_every_allowed_loop_still_exists() -> None:
    """A stale entry would let a new polling loop in the same function pass unseen."""
    stale = sorted(set(ALLOWED) - set(found()))
    assert not stale, f"ALLOWED names loops that are gone: {stale}"


def test_the_scan_sees_what_it_must_and_only_that() -> None:
    code = """
import time, anyio

def polls():
    while not ready():
        time.sleep(0.1)

async def polls_async():
    while True:
        if await ready():
            break
        await anyio.sleep(0.1)

def outer():
    while True:  # its body's sleep is the nested loop's, reported there
        while not ready():
            time.sleep(1)
        do()

async def waits_on_an_event(ev):
    while not done():
        await ev.wait()

def defines_a_sleeper():
    while more():
        def later():
            time.sleep(1)
        schedule(later)
"""
    assert list(polling_loops(ast.parse(code))) == [(5, "polls"), (9, "polls_async"), (16, "outer")]
