"""The agent's HA elector (``agent.ha``) against the API emulator: two electors, each with its own user and
only the rights the gateway pod's Role will grant (``get`` and ``update`` on the one Lease, by
resourceName; the emulator enforces RBAC), contending for one Lease that the test creates with no holder,
as the controller will.

The first takes the Lease and the second stands by; a killed holder (cancelled without its release) is
taken over only once its Lease has gone unrenewed for its duration; a holder stopped gracefully releases,
and the standby takes over at its next read; a holder cut off from the API (its requests hang) turns
standby by its own clock before the other turns active (both instants on this process's one monotonic
clock); a 409 loses the race; the role file follows the role; ``ha`` appearing on a serving pod keeps it
active, ``ha`` gone makes it active. ``tests/integration/test_agent_ha_real.py`` runs the takeover and the
partition order against the real kube-apiserver (``World`` is what differs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
import pytest

from agent.ha import ROLE_FILE, Api, FollowHa, LeaseElector
from agent.runtime import Role
from gwkit.kube import KubeClient, load
from gwplan import Child, GatewayRef, Ha, Ipsec, Plan, Tunnel, dumps
from lab.kubeapi import KubeAPIThread
from lab.wait import wait_for, wait_for_async

ROOT = Path(__file__).resolve().parents[2]
LEASE = "gw-ha"
HA = Ha(LEASE, lease_duration_seconds=2, renew_seconds=0.25)  # deadline 1.5 s, margin 0.5 s
POD_RULES = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [LEASE],
        "verbs": ["get", "update"],
    }
]
"""The gateway pod's rights on its Lease (what the controller's Role must grant): no create, no list."""


class World(Protocol):
    """An API server with the Lease's namespace, as the tests need it."""

    namespace: str

    def pod_kubeconfig(self, pod: str) -> Path:
        """A kubeconfig for ``pod``'s own identity, bound to a Role with ``POD_RULES`` only."""
        ...

    def create_lease(self, spec: dict[str, Any]) -> None: ...

    def post_lease(self, name: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Create Lease ``name`` as the admin: the answer's code and body."""
        ...

    def lease(self) -> dict[str, Any] | None: ...

    def delete_lease(self) -> None:
        """Delete the Lease as the admin (the controller, or someone by hand)."""
        ...

    def partition(self, pod: str) -> None:
        """From now on every request of ``pod`` hangs (it never gets an answer)."""
        ...

    def heal(self, pod: str) -> None: ...


def role_binding(namespace: str, subjects: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "gw-ha-pod", "namespace": namespace},
            "rules": POD_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gw-ha-pod", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gw-ha-pod"},
            "subjects": subjects,
        },
    ]


def lease_doc(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": namespace},
        "spec": spec,
    }


class EmulatorWorld:
    namespace = "tenant-ha"

    def __init__(self, api: KubeAPIThread, tmp: Path) -> None:
        self.api = api
        self.tmp = tmp
        self.faults: dict[str, Any] = {}
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        subjects = [
            {"kind": "User", "name": p, "apiGroup": "rbac.authorization.k8s.io"} for p in ("pod-a", "pod-b")
        ]
        for doc in role_binding(self.namespace, subjects):
            api.create(doc)

    def pod_kubeconfig(self, pod: str) -> Path:
        return self.api.write_kubeconfig(
            self.tmp / f"{pod}.kubeconfig", self.api.user_token(pod), self.namespace, pod
        )

    def create_lease(self, spec: dict[str, Any]) -> None:
        self.api.create(lease_doc(self.namespace, spec))

    def lease(self) -> dict[str, Any] | None:
        return self.api.get("coordination.k8s.io/v1", "Lease", LEASE, self.namespace)

    def delete_lease(self) -> None:
        self.api.delete("coordination.k8s.io/v1", "Lease", LEASE, self.namespace)

    def post_lease(self, name: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        doc = {**lease_doc(self.namespace, spec), "metadata": {"name": name, "namespace": self.namespace}}
        with httpx.Client(
            base_url=self.api.url,
            verify=ssl.create_default_context(cafile=str(self.api.ca_file)),
            headers={"Authorization": f"Bearer {self.api.admin_token}"},
        ) as c:
            r = c.post(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", json=doc)
        return r.status_code, r.json()

    def partition(self, pod: str) -> None:
        self.api.inject_fault(count=-1, user=pod, hang=60.0)

    def heal(self, pod: str) -> None:
        self.api.clear_faults()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig") as api:
        yield EmulatorWorld(api, tmp_path)


class Pod:
    """One gateway pod's elector, run in a cancel scope of its own: ``stop()`` is SIGTERM (it releases),
    ``kill()`` a SIGKILL (it does not)."""

    def __init__(self, world: World, tmp: Path, name: str, ha: Ha | None = HA) -> None:
        self.name = name
        self.world = world
        self.kube = KubeClient(load(world.pod_kubeconfig(name)), user_agent=name, timeout=30.0)
        self.role_file = tmp / name / ROLE_FILE
        self.elector = LeaseElector(self._connect, name, ha, role_file=self.role_file)
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.seen: list[Role] = []

    async def _connect(self) -> Api:
        return Api(self.kube, self.world.namespace)

    async def run(self) -> None:
        with self.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch)
                await self.elector.run()
        self.done.set()

    async def _watch(self) -> None:
        async for role in self.elector:
            self.seen.append(role)

    def stop(self) -> None:
        self.scope.cancel()

    def kill(self) -> None:
        self.elector.release_on_stop = False
        self.scope.cancel()

    def file_role(self) -> str | None:
        try:
            return self.role_file.read_text().strip()
        except OSError:
            return None

    def instant(self, role: Role, after: float = 0.0) -> float | None:
        """The first change to ``role`` at or after ``after`` (monotonic), if any."""
        return next((t for t, r in self.elector.changes if r == role and t >= after), None)


@contextlib.asynccontextmanager
async def pods(world: World, tmp: Path, *names: str, ha: Ha | None = HA) -> AsyncIterator[list[Pod]]:
    out = [Pod(world, tmp, n, ha) for n in names]
    try:
        async with anyio.create_task_group() as tg:
            for p in out:
                tg.start_soon(p.run)
            yield out
            tg.cancel_scope.cancel()
    finally:
        for p in out:
            await p.kube.aclose()


def holder(world: World) -> str:
    return str(((world.lease() or {}).get("spec") or {}).get("holderIdentity") or "")


async def active(pod: Pod, timeout: float = 15.0) -> None:
    await wait_for_async(lambda: pod.elector.current == "active", timeout, f"{pod.name} active")


MICRO = "2026-12-03T16:00:00.123456Z"


@pytest.mark.parametrize(
    "spec, code, stored",
    [
        pytest.param(
            {"holderIdentity": "", "renewTime": MICRO, "leaseDurationSeconds": 1}, 201, MICRO, id="released"
        ),
        pytest.param(
            {"renewTime": "2026-12-03T17:00:00.123456+01:00"}, 201, MICRO, id="offset-stored-in-utc"
        ),
        pytest.param({"renewTime": None}, 201, None, id="null-dropped"),
        pytest.param({"renewTime": "2026-12-03T16:00:00Z"}, 400, None, id="no-fraction"),
        pytest.param({"acquireTime": "2026-12-03T16:00:00.12345Z"}, 400, None, id="five-digits"),
        pytest.param({"acquireTime": "2026-12-03T16:00:00.1234567Z"}, 400, None, id="seven-digits"),
        pytest.param({"renewTime": "garbage"}, 400, None, id="no-time"),
        pytest.param({"leaseDurationSeconds": 0}, 422, None, id="zero-duration"),
        pytest.param({"leaseDurationSeconds": -3}, 422, None, id="negative-duration"),
        pytest.param({"leaseTransitions": -1}, 422, None, id="negative-transitions"),
    ],
)
def test_the_lease_fields_are_judged_as_kube_apiserver_judges_them(
    world: World, spec: dict[str, Any], code: int, stored: str | None
) -> None:
    """What the elector writes must pass the real server: a MicroTime has exactly six fraction digits
    (measured against kube-apiserver v1.35.4, which refuses anything else with a 400); the emulator judges
    the same (``lab.kubeapi.kinds.decode_lease``, ``validate_lease``)."""
    got, body = world.post_lease("probe", spec)
    assert got == code, body
    if code == 400:
        assert body["message"].startswith(
            'Lease in version "v1" cannot be handled as a Lease: parsing time "'
        )
    if code == 422:
        assert body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == next(
            f"spec.{k}" for k in spec
        )
    if code == 201:
        assert body["spec"].get("renewTime") == stored


def test_the_first_takes_the_free_lease_and_the_second_stands_by(world: World, tmp_path: Path) -> None:
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a") as (a,):
            assert a.elector.current == "standby" and a.file_role() == "standby", "ha in the first plan"
            await active(a)
            async with pods(world, tmp_path, "pod-b") as (b,):
                await wait_for_async(lambda: b.elector.memory.seen is not None, 10, "pod-b reading the Lease")
                await anyio.sleep(HA.lease_duration_seconds + 0.5)  # a renews meanwhile: b must not take it
                assert (a.elector.current, b.elector.current) == ("active", "standby")
                assert (a.file_role(), b.file_role()) == ("active", "standby")
                assert a.seen == ["standby", "active"] and b.seen == ["standby"]
                lease = world.lease()
                assert lease is not None
                assert lease["spec"]["holderIdentity"] == "pod-a"
                assert lease["spec"]["leaseTransitions"] == 1
                assert lease["spec"]["renewTime"] > lease["spec"]["acquireTime"]
                b.stop()

    anyio.run(scenario)
    assert holder(world) == "", "stopped gracefully, pod-a released it"


def test_a_killed_holder_is_taken_over_only_after_its_duration(world: World, tmp_path: Path) -> None:
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a") as (a,):
            await active(a)
            async with pods(world, tmp_path, "pod-b") as (b,):
                await wait_for_async(lambda: b.elector.memory.seen is not None, 10, "pod-b reading the Lease")
                a.kill()
                await a.done.wait()
                last_renewal = a.elector.memory.renewed_at
                assert last_renewal is not None
                assert holder(world) == "pod-a", "a kill releases nothing"
                await active(b)
                promoted = b.instant("active")
                assert promoted is not None
                # Safety, not speed: b could only take it a whole duration after a's last renewal was sent.
                assert promoted >= last_renewal + HA.lease_duration_seconds
                assert b.file_role() == "active"
                assert holder(world) == "pod-b"

    anyio.run(scenario)


def test_a_graceful_stop_releases_and_the_standby_takes_over_without_waiting(
    world: World, tmp_path: Path
) -> None:
    slow = Ha(LEASE, lease_duration_seconds=60, renew_seconds=0.25)  # expiry alone would take a minute
    # pod-a holds it already (a Lease first seen free is taken only after a duration too: a minute).
    world.create_lease({"holderIdentity": "pod-a", "renewTime": MICRO, "leaseDurationSeconds": 60})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a", ha=slow) as (a,):
            await active(a)
            async with pods(world, tmp_path, "pod-b", ha=slow) as (b,):
                await wait_for_async(lambda: b.elector.memory.seen is not None, 10, "pod-b reading the Lease")
                a.stop()
                await a.done.wait()
                assert a.elector.current == "standby" and a.file_role() == "standby"
                await active(b, timeout=20)  # far below the 60 s an unreleased Lease would need
                stood_down, promoted = a.instant("standby"), b.instant("active")
                assert stood_down is not None and promoted is not None and stood_down < promoted
                assert holder(world) == "pod-b"

    anyio.run(scenario)


def test_a_partitioned_holder_turns_standby_before_the_other_turns_active(
    world: World, tmp_path: Path
) -> None:
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a", "pod-b") as (a, b):
            await wait_for_async(
                lambda: {a.elector.current, b.elector.current} == {"active", "standby"}, 15, "one active"
            )
            first, second = (a, b) if a.elector.current == "active" else (b, a)
            await wait_for_async(lambda: second.elector.memory.seen is not None, 10, "the standby reading")
            world.partition(first.name)
            await active(second, timeout=20)
            fenced, promoted = first.instant("standby"), second.instant("active")
            assert fenced is not None and promoted is not None
            assert fenced < promoted, f"{first.name} fenced at {fenced}, {second.name} active at {promoted}"
            assert first.file_role() == "standby" and second.file_role() == "active"
            assert first.seen[-1] == "standby"
            world.heal(first.name)
            # Back in touch, the old holder reads the new one's Lease and stays standby.
            mark = first.elector.memory.seen
            await wait_for_async(lambda: first.elector.memory.seen != mark, 20, f"{first.name} reading again")
            await anyio.sleep(HA.renew_seconds * 4)
            assert (first.elector.current, second.elector.current) == ("standby", "active")
            second.stop()

    anyio.run(scenario)


def test_a_take_that_meets_a_409_loses_the_race(world: World, tmp_path: Path) -> None:
    assert isinstance(world, EmulatorWorld)
    api = world.api
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})
    # pod-b's first update waits 1 s in the server before it is judged: pod-a reads and updates meanwhile.
    api.inject_fault(count=1, verb="update", user="pod-b", hang=1.0)

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-b") as (b,):
            await wait_for_async(
                lambda: b.elector.memory.seen is not None, 10, "pod-b reading the free Lease"
            )
            async with pods(world, tmp_path, "pod-a") as (a,):
                await active(a)
                await wait_for_async(
                    lambda: [r.code for r in api.requests(user="pod-b", verb="update")], 10, "pod-b's update"
                )
                assert next(r.code for r in api.requests(user="pod-b", verb="update")) == 409
                await anyio.sleep(HA.renew_seconds * 4)
                assert (a.elector.current, b.elector.current) == ("active", "standby")
                assert b.seen == ["standby"] and b.file_role() == "standby", "b was never active"
                assert holder(world) == "pod-a"
                b.stop()

    anyio.run(scenario)


def test_an_absent_lease_is_standby_and_never_created(world: World, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a") as (a,):
            await wait_for_async(lambda: a.elector.lease_absent, 10, "the absent Lease noticed")
            assert a.elector.current == "standby" and world.lease() is None
            world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})  # the controller's part
            await active(a)
            assert holder(world) == "pod-a"

    anyio.run(scenario)


def test_a_deleted_lease_keeps_its_holder_until_its_deadline_and_a_recreated_one_is_no_release(
    world: World, tmp_path: Path
) -> None:
    """HA turned off (or the Lease deleted by hand) while pod-a holds it: pod-a serves on until its own
    fence deadline (a 404 is a failed read for the holder: nobody can hold a deleted Lease), not one
    tunnel terminated at the 404. Re-created free meanwhile: pod-a, still serving, takes it back at
    once; pod-b, which saw it held, then gone, then free, does not take it before a whole duration."""
    world.create_lease({"holderIdentity": "pod-a", "renewTime": MICRO, "leaseDurationSeconds": 3})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a", "pod-b") as (a, b):
            await active(a)
            await wait_for_async(lambda: b.elector.memory.seen is not None, 10, "pod-b reading the Lease")
            deleted = time.monotonic()
            world.delete_lease()
            await wait_for_async(lambda: a.elector.lease_absent, 5, "pod-a reading the 404")
            assert a.seen[-1:] == ["active"] and a.file_role() == "active", "not standby at the 404"
            # Gone for longer than the deadline: pod-a is fenced by its own clock, never earlier.
            await wait_for_async(lambda: a.elector.current == "standby", 10, "pod-a fenced")
            fenced = a.instant("standby")
            assert fenced is not None
            assert fenced - deleted >= 1.0, fenced - deleted
            assert b.seen == ["standby"]
            # Re-created free (the controller's CREATE_ONLY): no release seen, so a whole duration.
            world.create_lease({"leaseDurationSeconds": 3})
            recreated = time.monotonic()
            await wait_for_async(
                lambda: holder(world) != "", 15, "someone taking the re-created Lease after a duration"
            )
            took = max(a.instant("active", recreated) or 0.0, b.instant("active", recreated) or 0.0)
            assert took - recreated >= HA.lease_duration_seconds - 0.05, took - recreated

    anyio.run(scenario)


def test_a_lease_recreated_before_its_holders_deadline_is_taken_back_at_once_by_the_holder_alone(
    world: World, tmp_path: Path
) -> None:
    world.create_lease({"holderIdentity": "pod-a", "renewTime": MICRO, "leaseDurationSeconds": 3})

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a", "pod-b") as (a, b):
            await active(a)
            await wait_for_async(lambda: b.elector.memory.seen is not None, 10, "pod-b reading the Lease")
            served = len(a.elector.changes)
            world.delete_lease()
            await wait_for_async(lambda: a.elector.lease_absent, 5, "pod-a reading the 404")
            world.create_lease({"leaseDurationSeconds": 3})
            await wait_for_async(lambda: holder(world) == "pod-a", 5, "pod-a taking it back")
            await anyio.sleep(HA.lease_duration_seconds + 1)
            assert len(a.elector.changes) == served and a.elector.current == "active", "no blip"
            assert b.seen == ["standby"], "never two active"
            assert holder(world) == "pod-a"

    anyio.run(scenario)


class Plans:
    """A plan source the test feeds."""

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[Any](10)
        self.last_error: str | None = None

    async def _iterate(self) -> AsyncIterator[Any]:
        async for plan in self.receive:
            yield plan

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()


def test_ha_appearing_on_a_serving_pod_keeps_it_active_and_ha_gone_makes_it_active(
    world: World, tmp_path: Path
) -> None:
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})

    class P:
        def __init__(self, ha: Ha | None) -> None:
            self.ha = ha

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a", ha=None) as (a,):
            assert a.elector.current == "active" and a.file_role() == "active", "no ha: active"
            plans = Plans()
            followed: list[Any] = []

            async def backend() -> None:
                async for plan in FollowHa(plans, a.elector):
                    followed.append(plan)

            async with anyio.create_task_group() as tg:
                tg.start_soon(backend)
                await plans.send.send(P(HA))
                await wait_for_async(lambda: holder(world) == "pod-a", 10, "pod-a holding the Lease")
                assert a.seen == ["active"], "enabling HA is no outage"
                await plans.send.send(P(None))
                await wait_for_async(lambda: holder(world) == "", 10, "the Lease released")
                assert a.elector.current == "active" and a.seen == ["active"] and a.file_role() == "active"
                # ha back while another pod holds the Lease: standby at once.
                async with pods(world, tmp_path, "pod-b") as (b,):
                    await active(b)
                    await plans.send.send(P(HA))
                    await wait_for_async(lambda: a.seen[-1:] == ["standby"], 10, "pod-a standing by")
                    assert a.file_role() == "standby"
                    b.stop()
                tg.cancel_scope.cancel()
            assert len(followed) == 3

    anyio.run(scenario)


def test_the_agent_process_follows_ha_in_its_plan_and_releases_on_sigterm(
    world: World, tmp_path: Path
) -> None:
    """``python -m agent`` as the pod runs it (``$POD_NAME``, ``$POD_NAMESPACE``, the pod's kubeconfig,
    ``--live-dir``), charon absent: the plan's ``ha`` makes it take the Lease and write the role file; ``ha``
    dropped from the plan releases the Lease and keeps it active; back, it takes it again; SIGTERM releases
    it and leaves ``standby`` in the role file, and in the exporter's copy (``--readonly-dir``)."""
    gateway = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", world.namespace, "gw")
    conn = {"s1": {"version": "2", "children": {"s1-0": {"remote_ts": ["10.1.0.0/24"]}}}}
    plan = Plan(
        gateway=gateway,
        type="ipsec",
        ipsec=Ipsec(tunnels=(Tunnel("s1", True, (Child("s1-0", "10.1.0.0/24"),), conn),)),
        ha=HA,
    )
    plan_file, live, ro = tmp_path / "plan.json", tmp_path / "live", tmp_path / "ro"

    def write(p: Plan) -> None:
        tmp = plan_file.with_name(".plan.tmp")
        tmp.write_bytes(dumps(p))
        tmp.replace(plan_file)

    def role_file(directory: Path = live) -> str:
        try:
            return (directory / ROLE_FILE).read_text().strip()
        except OSError:
            return ""

    write(plan)
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})
    env = {**os.environ, "POD_NAME": "pod-a", "POD_NAMESPACE": world.namespace, "PYTHONPATH": str(ROOT)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [
        sys.executable, "-m", "agent", "--plan", str(plan_file), "--secrets-dir", str(tmp_path),
        "--vici-socket", str(tmp_path / "no-charon.vici"), "--live-dir", str(live),
        "--kubeconfig", str(world.pod_kubeconfig("pod-a")), "--poll-interval", "0.05",
        "--readonly-dir", str(ro),
    ]  # fmt: skip
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stderr=out, cwd=ROOT)
    try:
        wait_for(lambda: holder(world) == "pod-a" and role_file() == "active", 30, "pod-a holding the Lease")
        wait_for(lambda: role_file(ro) == "active", 5, "the exporter's copy of the role")
        write(dataclasses.replace(plan, ha=None))
        wait_for(lambda: holder(world) == "", 15, "the Lease released when ha left the plan")
        assert role_file() == "active"
        write(plan)
        wait_for(lambda: holder(world) == "pod-a", 15, "the Lease taken again")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert holder(world) == "" and role_file() == "standby", text
    assert role_file(ro) == "standby", "the exporter's copy, written once more on the way out"
    assert "ha.released" in text and "ha.disabled" in text, text
    assert "Bearer" not in text and "token" not in text.lower(), "no credential in the log"


def test_no_api_client_is_no_crash_and_a_serving_pod_is_fenced_at_its_deadline() -> None:
    attempts: list[float] = []

    async def connect() -> Api:
        attempts.append(anyio.current_time())
        raise OSError("no kubeconfig here")

    async def scenario() -> None:
        elector = LeaseElector(connect, "pod-a", None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(elector.run)
            await wait_for_async(lambda: elector.current == "active", 5, "active without ha")
            elector.follow(HA)
            await wait_for_async(lambda: elector.current == "standby", 10, "fenced: it never renewed")
            await wait_for_async(lambda: len(attempts) >= 3, 10, "the client asked for again")
            tg.cancel_scope.cancel()
        assert [r for _, r in elector.changes] == ["standby"], "active until the deadline, then standby"

    anyio.run(scenario)


def test_another_lease_name_releases_the_old_one_and_new_timings_apply_in_place(
    world: World, tmp_path: Path
) -> None:
    assert isinstance(world, EmulatorWorld)
    api, ns = world.api, world.namespace
    world.create_lease({"leaseDurationSeconds": HA.lease_duration_seconds})
    api.create(
        {**lease_doc(ns, {"leaseDurationSeconds": 2}), "metadata": {"name": "gw-ha-2", "namespace": ns}}
    )
    rules = [{**POD_RULES[0], "resourceNames": ["gw-ha-2"]}]
    for doc in role_binding(ns, [{"kind": "User", "name": "pod-a", "apiGroup": "rbac.authorization.k8s.io"}]):
        doc["metadata"]["name"] = "gw-ha-2-pod"
        if doc["kind"] == "Role":
            doc["rules"] = rules
        else:
            doc["roleRef"]["name"] = "gw-ha-2-pod"
        api.create(doc)

    def holder_of(name: str) -> str:
        got = api.get("coordination.k8s.io/v1", "Lease", name, ns) or {}
        return str((got.get("spec") or {}).get("holderIdentity") or "")

    async def scenario() -> None:
        async with pods(world, tmp_path, "pod-a") as (a,):
            await active(a)
            slower = Ha(LEASE, lease_duration_seconds=4, renew_seconds=0.5)
            a.elector.follow(slower)
            await wait_for_async(
                lambda: (
                    (api.get("coordination.k8s.io/v1", "Lease", LEASE, ns) or {})["spec"].get(
                        "leaseDurationSeconds"
                    )
                    == 4
                ),
                10,
                "the new duration written at the next renewal",
            )
            assert a.seen == ["standby", "active"], "new timings: no standby"
            a.elector.follow(Ha("gw-ha-2", 2, 0.25))
            await wait_for_async(
                lambda: holder_of("gw-ha-2") == "pod-a" and a.seen[-1] == "active", 10, "gw-ha-2"
            )
            assert holder_of(LEASE) == "", "the old Lease released"
            assert [r for _, r in a.elector.changes] == ["active", "standby", "active"], "stood down first"

    anyio.run(scenario)
