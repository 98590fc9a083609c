"""The agent's shared runtime against real files, real sockets and an emulated Kubernetes API.

KubeStatusSink is tested through gwkit.kube against lab.kubeapi, a real HTTPS server that EMULATES the
Kubernetes API (status subresource semantics included); the conflict/retry path, scripted in zero time,
uses ``FakeStatusApi``, a small in-memory fake.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from agent.health import HealthState, serve
from agent.runtime import SecretError
from agent.sink import (
    PERSISTENT,
    FakeStatusApi,
    FileStatusSink,
    KubeStatusApi,
    KubeStatusSink,
    StatusWriteError,
)
from agent.sources import COPY_GZIP_ABOVE, CopiedPlans, FilePlanSource, FileSecrets, plan_copy
from controller.api.crds import crds
from gwkit.kube import KubeClient, load
from gwplan import Child, GatewayRef, Ipsec, Plan, SecretRef, Tunnel, dumps, loads
from lab.kubeapi import KubeAPI
from lab.kubelet.volumes import write_atomic
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio

GW = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw1")
PSK = b"runtime-test-psk-9c1d"  # test-only value


def plan(*names: str) -> Plan:
    tunnels = tuple(Tunnel(n, True, (Child(f"{n}-0", "10.0.0.0/24"),), {n: {"version": "2"}}) for n in names)
    return Plan(gateway=GW, type="ipsec", ipsec=Ipsec(tunnels=tunnels))


def replace_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --- plan source ---------------------------------------------------------------------------------------


async def test_copied_plans_writes_each_plan_for_the_exporter_before_the_backend_sees_it(
    tmp_path: Path,
) -> None:
    """``--readonly-dir``: the exporter's copy (0644, the only file of the agent's it reads); a plan the
    agent rejects is never copied (the last good one stays), a large one is gzip-compressed."""
    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    copy_path = tmp_path / "ro" / "plan.json"
    copied = CopiedPlans(FilePlanSource(f, 0.01), copy_path)
    seen: list[Plan] = []
    async for p in copied:
        assert loads(copy_path.read_bytes()) == p, "written before the backend gets it"
        seen.append(p)
        if len(seen) == 1:
            replace_atomically(f, b"{not json")  # rejected: the copy keeps the last good plan
            await anyio.sleep(0.1)
            assert loads(copy_path.read_bytes()) == seen[0]
            replace_atomically(f, dumps(plan("a", "b")))
        else:
            break
    assert [[t.name for t in q.ipsec.tunnels] for q in seen] == [["a"], ["a", "b"]]  # type: ignore[union-attr]
    assert copy_path.stat().st_mode & 0o777 == 0o644
    big = plan(*(f"t{i:05d}" for i in range(9000)))
    assert len(dumps(big)) > COPY_GZIP_ABOVE
    data = plan_copy(big)
    assert data[:2] == b"\x1f\x8b" and len(data) < len(dumps(big)) / 5 and loads(data) == big
    assert plan_copy(plan("a")) == dumps(plan("a"))


async def test_copied_plans_never_hold_the_backend_up_when_the_copy_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    (tmp_path / "file").write_text("not a directory")
    copied = CopiedPlans(FilePlanSource(f, 0.01), tmp_path / "file" / "plan.json")
    async for p in copied:
        assert [t.name for t in p.ipsec.tunnels] == ["a"]  # type: ignore[union-attr]
        break
    assert "plan.copy_failed" in caplog.text


def test_plan_atomic_rename_yields_only_on_content_change(tmp_path: Path) -> None:
    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    src = FilePlanSource(f)
    first = src.poll()
    assert first is not None and [t.name for t in first.ipsec.tunnels] == ["a"]  # type: ignore[union-attr]
    assert src.poll() is None
    replace_atomically(f, dumps(plan("a")))  # new inode, same content
    assert src.poll() is None
    replace_atomically(f, dumps(plan("a", "b")))
    second = src.poll()
    assert second is not None and [t.name for t in second.ipsec.tunnels] == ["a", "b"]  # type: ignore[union-attr]


def test_plan_kubelet_symlink_swap_is_noticed(tmp_path: Path) -> None:
    write_atomic(tmp_path, {"plan.json": (dumps(plan("a")), 0o644)})  # the kubelet's own ..data swap
    src = FilePlanSource(tmp_path / "plan.json")
    assert src.poll() is not None
    write_atomic(tmp_path, {"plan.json": (dumps(plan("a", "c")), 0o644)})
    new = src.poll()
    assert new is not None and len(new.ipsec.tunnels) == 2  # type: ignore[union-attr]


def test_invalid_plan_keeps_last_good_and_says_why_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    src = FilePlanSource(f)
    good = src.poll()
    doc = json.loads(dumps(plan("a")))
    doc["ipsec"]["tunnels"][0]["initiate"] = "yes"
    del doc["hash"]
    caplog.set_level(logging.INFO, logger="agent.sources")
    replace_atomically(f, json.dumps(doc).encode())
    assert src.poll() is None
    assert src.last_error is not None and "ipsec.tunnels[0].initiate" in src.last_error
    os.utime(f)  # the same bad content again: no second log line
    assert src.poll() is None
    assert len([r for r in caplog.records if "plan.rejected" in r.getMessage()]) == 1
    assert src.current == good
    replace_atomically(f, dumps(plan("a")))  # back to the running plan: nothing new to apply
    assert src.poll() is None and src.last_error is None


def test_missing_plan_is_an_error_not_a_crash(tmp_path: Path) -> None:
    src = FilePlanSource(tmp_path / "nope.json")
    assert src.poll() is None
    assert src.last_error is not None and "nope.json" in src.last_error


async def test_iterating_yields_current_then_changes(tmp_path: Path) -> None:
    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    src = FilePlanSource(f, poll_interval=0.01)
    seen: list[int] = []
    with anyio.fail_after(5):
        async for p in src:
            seen.append(len(p.ipsec.tunnels))  # type: ignore[union-attr]
            if len(seen) == 1:
                replace_atomically(f, dumps(plan("a", "b")))
            else:
                break
        async for p in src:  # a second iteration restarts from the current good plan
            seen.append(len(p.ipsec.tunnels))  # type: ignore[union-attr]
            break
    assert seen == [1, 2, 2]


# --- secrets --------------------------------------------------------------------------------------------


def test_secrets_read_and_version_changes_with_value(tmp_path: Path) -> None:
    ref = SecretRef("psk", "key")
    (tmp_path / "psk").mkdir()
    (tmp_path / "psk" / "key").write_bytes(PSK)
    s = FileSecrets(tmp_path)
    assert s.read(ref) == PSK
    v1 = s.version(ref)
    assert s.version(ref) == v1 and PSK.decode() not in v1
    (tmp_path / "psk" / "key").write_bytes(PSK + b"-rotated")
    assert s.version(ref) != v1


@pytest.mark.parametrize(
    "ref, setup, needle",
    [
        pytest.param(SecretRef("psk", "key"), None, "not mounted", id="missing"),
        pytest.param(SecretRef("psk", "key"), b"", "empty", id="empty"),
        pytest.param(SecretRef("..", "key"), None, "one path component", id="traversal"),
    ],
)
def test_secret_errors_name_the_secret_never_the_value(
    tmp_path: Path, ref: SecretRef, setup: bytes | None, needle: str
) -> None:
    if setup is not None:
        (tmp_path / ref.name).mkdir()
        (tmp_path / ref.name / ref.key).write_bytes(setup)
    with pytest.raises(SecretError) as info:
        FileSecrets(tmp_path).read(ref)
    assert needle in str(info.value) and ref.key in str(info.value)
    assert PSK.decode() not in str(info.value)


# --- status sinks --------------------------------------------------------------------------------------


async def test_file_sink_writes_atomically_and_only_on_change(tmp_path: Path) -> None:
    f = tmp_path / "out" / "status.json"
    sink = FileStatusSink(f)
    await sink.publish({"tunnels": [{"name": "a", "state": "Down"}]})
    ino = f.stat().st_ino
    await sink.publish({"tunnels": [{"name": "a", "state": "Down"}]})
    assert sink.writes == 1 and f.stat().st_ino == ino
    await sink.publish({"tunnels": [{"name": "a", "state": "Established"}]})
    assert sink.writes == 2 and f.stat().st_ino != ino  # replaced by rename, never rewritten in place
    assert json.loads(f.read_text())["tunnels"][0]["state"] == "Established"
    assert [p.name for p in f.parent.iterdir()] == ["status.json"]


async def test_file_sink_survives_an_unwritable_volume_and_retries(tmp_path: Path) -> None:
    """A full disk or read-only volume must not take the agent (and the tunnels) down."""
    d = tmp_path / "ro"
    d.mkdir()
    sink = FileStatusSink(d / "status.json")
    d.chmod(0o500)
    try:
        if os.access(d, os.W_OK):  # root ignores directory modes: make the target a directory instead
            d.chmod(0o700)
            (d / "status.json").mkdir()
        await sink.publish({"tunnels": []})  # must not raise
        assert sink.writes == 0 and sink.error is not None
    finally:
        d.chmod(0o700)
        if (d / "status.json").is_dir():
            (d / "status.json").rmdir()
    await sink.publish({"tunnels": []})  # the same status is written once the volume is back
    assert sink.writes == 1 and sink.error is None
    assert json.loads((d / "status.json").read_text()) == {"tunnels": []}


GW_DOC = {
    "apiVersion": "vpn.bnerd.net/v1alpha1",
    "kind": "VPNGateway",
    "metadata": {"name": "gw1", "namespace": "tenant-a"},
    "spec": {
        "type": "wireguard",
        "serviceCIDR": "198.18.0.0/24",
        "wireguard": {
            "listenPort": 51820,
            "address": "10.99.0.1/24",
            "privateKeySecretRef": {"name": "k", "key": "k"},
        },
    },
}


async def test_kube_sink_merge_patches_the_status_subresource_on_the_api_emulator(tmp_path: Path) -> None:
    async with KubeAPI(workdir=tmp_path / "api") as api:
        for crd in crds():
            api.create(crd)
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-a"}})
        api.create(copy.deepcopy(GW_DOC))
        api.patch(
            "vpn.bnerd.net/v1alpha1",
            "VPNGateway",
            "gw1",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            "tenant-a",
            subresource="status",
        )
        async with KubeClient(load(api.kubeconfig)) as kube:
            sink = KubeStatusSink(GW, KubeStatusApi(kube))
            async with anyio.create_task_group() as tg:
                tg.start_soon(sink.run)
                await sink.publish({"tunnels": [{"name": "a", "state": "Connecting"}]})
                await sink.publish({"tunnels": [{"name": "a", "state": "Established"}]})
                await wait_for_async(lambda: not sink.pending, 10, "the published status written", 0.01)
                tg.cancel_scope.cancel()
        obj = api.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw1", "tenant-a")
        assert obj is not None
        assert obj["status"]["tunnels"] == [{"name": "a", "state": "Established"}]
        assert obj["status"]["conditions"] == [{"type": "Ready", "status": "True"}], (
            "merge patch, not replace"
        )
        patches = api.requests(verb="patch")
        assert patches and all(r.subresource == "status" for r in patches)
        assert all(r.content_type.startswith("application/merge-patch+json") for r in patches)


async def test_kube_sink_reports_missing_cr_as_failure_and_keeps_going(tmp_path: Path) -> None:
    async with KubeAPI(workdir=tmp_path / "api") as api:
        for crd in crds():
            api.create(crd)
        slept: list[float] = []

        async def sleep(s: float) -> None:
            slept.append(s)
            await anyio.lowlevel.checkpoint()

        async with KubeClient(load(api.kubeconfig)) as kube:
            sink = KubeStatusSink(GW, KubeStatusApi(kube), sleep=sleep)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sink.run)
                await sink.publish({"tunnels": []})
                await wait_for_async(lambda: bool(slept), 10, "the sink to back off", 0.01)
                tg.cancel_scope.cancel()
        assert sink.last_error is not None and "404" in sink.last_error
        assert slept[0] >= 10, "a 404 cannot succeed soon: wait long, do not hammer the API server"


async def test_kube_sink_retries_conflicts_and_writes_only_the_latest() -> None:
    api = FakeStatusApi(conflicts=2, failures=[StatusWriteError("HTTP 503", retry=True)])
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        await sink.publish({"n": 99})  # statuses published during the backoff replace the pending one
        await anyio.lowlevel.checkpoint()

    sink = KubeStatusSink(GW, api, sleep=sleep, min_interval=0)
    for n in range(5):
        await sink.publish({"n": n})  # never blocks: nothing is running yet
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run)
        await wait_for_async(
            lambda: not sink.pending and bool(api.writes), 10, "the queued status written", 0.01
        )
        tg.cancel_scope.cancel()
    assert api.attempts == 4 and len(slept) == 3
    assert api.writes == [{"n": 99}], "only the newest status is written, once"
    assert slept == sorted(slept), "backoff grows"


async def test_kube_sink_says_error_once_a_403_never_clears(caplog: pytest.LogCaptureFixture) -> None:
    """A 403 is retried with the normal backoff (a fresh Role reaches the authorizer late); one still
    there after PERSISTENT tries is a Role that does not grant it: each further failure is an ERROR."""
    forbidden = StatusWriteError("HTTP 403 Forbidden", retry=True)
    api = FakeStatusApi(failures=[forbidden] * (PERSISTENT + 1))
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        await anyio.lowlevel.checkpoint()

    sink = KubeStatusSink(GW, api, sleep=sleep, min_interval=0)
    with caplog.at_level(logging.INFO, logger="agent.sink"):
        await sink.publish({"n": 1})
        async with anyio.create_task_group() as tg:
            tg.start_soon(sink.run)
            await wait_for_async(lambda: bool(api.writes), 10, "the status written at last", 0.01)
            tg.cancel_scope.cancel()
    levels = [r.levelno for r in caplog.records if "status.write_failed" in r.getMessage()]
    assert levels == [logging.WARNING] * (PERSISTENT - 1) + [logging.ERROR] * 2
    assert slept[0] < 1, "retried with the backoff, not the 10 s floor of a write that cannot succeed"


async def test_kube_sink_writes_at_most_once_per_min_interval_latest_wins() -> None:
    """A status changing every poll (counters, a flapping tunnel) is one PATCH per interval, not per poll."""
    api = FakeStatusApi()
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        for n in range(10, 20):  # ten changes while the sink waits out its interval
            await sink.publish({"n": n})
        await anyio.lowlevel.checkpoint()

    sink = KubeStatusSink(GW, api, sleep=sleep, min_interval=5.0)
    await sink.publish({"n": 0})
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.run)
        await wait_for_async(
            lambda: len(api.writes) >= 2 and not sink.pending, 10, "both statuses written", 0.01
        )
        tg.cancel_scope.cancel()
    assert [w["n"] for w in api.writes] == [0, 19], "one write per interval, carrying the newest status"
    assert slept[:2] == [5.0, 5.0]


# --- health -------------------------------------------------------------------------------------------


async def _get(port: int, path: str) -> tuple[int, str]:
    async with await anyio.connect_tcp("127.0.0.1", port) as s:
        await s.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        try:
            while True:
                data += await s.receive()
        except anyio.EndOfStream:
            pass
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_health_server_liveness_and_readiness() -> None:
    now = [100.0]
    state = HealthState(stale_after=10, clock=lambda: now[0])
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, "127.0.0.1:0", state)
        state.beat()
        assert await _get(port, "/healthz") == (200, "ok\n")
        assert (await _get(port, "/readyz"))[0] == 503
        state.set_ready(False, "charon unreachable: connect refused")
        now[0] += 9  # the daemon is down but the loop still runs: live, not ready
        assert (await _get(port, "/healthz"))[0] == 200
        code, body = await _get(port, "/readyz")
        assert code == 503 and "charon unreachable" in body
        state.set_ready(True, "plan pushed")
        assert (await _get(port, "/readyz"))[0] == 200
        now[0] += 20  # no beat for 29 s: the loop is stuck
        code, body = await _get(port, "/healthz")
        assert code == 503 and "no heartbeat" in body
        assert (await _get(port, "/nope"))[0] == 404
        tg.cancel_scope.cancel()


async def test_a_plan_of_another_type_is_rejected_and_the_running_one_stays(tmp_path: Path) -> None:
    from agent.__main__ import SameTypePlans

    f = tmp_path / "plan.json"
    f.write_bytes(dumps(plan("a")))
    src = SameTypePlans(FilePlanSource(f, poll_interval=0.01), "ipsec")
    seen: list[str] = []
    with anyio.move_on_after(1):
        async for p in src:
            seen.append(p.type)
            replace_atomically(f, dumps(Plan(gateway=GW, type="wireguard")))
    assert seen == ["ipsec"]
    assert src.last_error is not None and "'wireguard' differs from the running 'ipsec'" in src.last_error


def test_a_gzip_compressed_plan_is_read_like_json(tmp_path: Path) -> None:
    import gzip

    f = tmp_path / "plan.json.gz"
    f.write_bytes(gzip.compress(dumps(plan("a", "b"))))
    p = FilePlanSource(f).poll()
    assert p is not None and [t.name for t in p.ipsec.tunnels] == ["a", "b"]  # type: ignore[union-attr]
