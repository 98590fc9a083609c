"""The lab kubelet's pod status write (model.merged_status, model.status_patch: a real kubelet's
mergePodStatus and two-way patch), applied as the emulator applies a strategic merge patch (lab.kubeapi.patch,
lists keyed as the real server's): the kubelet's own conditions are replaced, every other one kept, a
container's old state removed; and a deleted pod's terminal phase."""

from __future__ import annotations

from typing import Any

from lab.kubeapi.patch import strategic_merge
from lab.kubelet import model

FOREIGN = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
GATE = {"type": "example.com/gate", "status": "True"}


def view(**kw: Any) -> model.PodView:
    c = model.ContainerState(name="charon", image="i", state="running", started_at="T0", ready=True)
    return model.PodView(**{"phase": "Running", "sandbox_ready": True, "containers": (c,), **kw})


def write(current: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """What the pod's status is after the kubelet's write of ``mine`` (on the emulator)."""
    patch = model.status_patch(current, model.merged_status(current, mine))
    out: dict[str, Any] = strategic_merge({"metadata": {"name": "p"}, "status": current}, {"status": patch})
    status: dict[str, Any] = out["status"]
    return status


def test_the_kubelets_conditions_are_replaced_and_the_others_kept() -> None:
    pending = model.PodView(containers=(model.ContainerState(name="charon", image="i"),), reason="R")
    old, _ = model.pod_status(pending, "T0")
    assert {c["type"]: c for c in old["conditions"]}["Ready"]["reason"] == "ContainersNotReady"
    current = {**old, "conditions": [*old["conditions"], FOREIGN, GATE], "qosClass": "Burstable", "x": 1}
    new, _ = model.pod_status(view(), "T1")
    out = write(current, new)
    conds = {c["type"]: c for c in out["conditions"]}
    assert conds["DisruptionTarget"] == FOREIGN and conds["example.com/gate"] == GATE
    assert conds["Ready"] == {"type": "Ready", "status": "True", "lastTransitionTime": "T1"}, "stale reason"
    assert [c["state"] for c in out["containerStatuses"]] == [{"running": {"startedAt": "T0"}}]
    assert "reason" not in out, "the phase's reason the kubelet no longer has"
    assert out["x"] == 1, "a field the kubelet does not own"
    assert write(out, new) == out
    assert model.status_patch(out, model.merged_status(out, new)) == {}, "nothing changed: no write"


def test_a_containers_state_is_replaced_not_merged() -> None:
    running, _ = model.pod_status(view(), "T1")
    stopped = model.with_state(
        view().containers[0],
        state="terminated",
        exit_code=0,
        reason="Completed",
        finished_at="T2",
        ready=False,
    )
    done, _ = model.pod_status(view(containers=(stopped,), phase="Succeeded"), "T2")
    out = write(running, done)
    assert list(out["containerStatuses"][0]["state"]) == ["terminated"]
    assert out["phase"] == "Succeeded"


def test_terminal_phase_succeeded_only_when_every_container_exited_zero() -> None:
    ok = model.with_state(view().containers[0], state="terminated", exit_code=0)
    bad = model.with_state(ok, name="agent", exit_code=143)
    assert model.terminal_phase(view(containers=(ok,))) == "Succeeded"
    assert model.terminal_phase(view(containers=(ok, bad))) == "Failed"
    assert model.terminal_phase(view()) == "Failed", "a container still running (never stopped)"
