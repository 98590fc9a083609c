"""The executor's status contracts (issue 21, item 5), run against the API emulator (tests/component) and
the real kube-apiserver (tests/integration): the same function, so a difference shows as one test failing.

* Writes the API refuses do not stop the others, and the status written at the end says each one with
  the API's reason and message (an object of our name that is someone else's: whose it is), once: the
  retry that meets the same refusals writes nothing and sends no second Event.
* A status decided on a stale read of the gateway is a 409 and a requeue: it never overwrites the newer
  status, and no Event is sent for it; a read made stale only by the status-agent's own keys does not
  hold the status back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from controller import diff, execute
from controller.names import LABEL_OWNER_UID, key_of
from controller.reconcile import Decision, Report, outcome
from controller.status import Condition
from gwkit.kube.client import CONFIGMAPS, EVENTS, NAMESPACES, VPNGATEWAYS, KubeClient
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import Conflict
from tests.examples import example_docs
from tests.helpers import conditions, create_when_served
from tests.kube_contract import _with_crds

NOW, LATER = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"
THEIRS = {"app.kubernetes.io/managed-by": "someone-else"}


async def _gateway(kube: KubeClient, namespace: str) -> dict[str, Any]:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    with contextlib.suppress(Conflict):
        await kube.create(NAMESPACES, ns)
    await _with_crds(kube)
    return await create_when_served(kube, VPNGATEWAYS, example_docs("wireguard.yaml")[0], namespace)


def _decision(
    gateway: Mapping[str, Any], actions: Sequence[diff.Action], now: str, parts: Sequence[Condition] = ()
) -> Decision:
    report = Report(
        parts=tuple(parts) or (Condition("ConfigRendered", True, "Rendered", "ok"),),
        foreign=(),
        seen=gateway.get("status") or {},
        generation=int(gateway["metadata"].get("generation") or 0),
        node=None,
        public_ip=None,
        now=now,
    )
    status, events = outcome(report)
    return Decision(tuple(actions), (), status, tuple(events), None, report)


def _config_map(
    namespace: str, name: str, labels: Mapping[str, str], data: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "data": dict(data),
    }


async def _events_of(kube: KubeClient, gateway: Mapping[str, Any]) -> list[dict[str, Any]]:
    items, _ = await kube.list(EVENTS, gateway["metadata"]["namespace"])
    uid = gateway["metadata"]["uid"]
    return [e for e in items if (e.get("involvedObject") or {}).get("uid") == uid]


async def refused_writes_are_said_in_the_status_once(kubeconfig: Path, namespace: str) -> dict[str, Any]:
    """Three creates: one of a name someone else's ConfigMap has (409 AlreadyExists), one the API finds
    invalid (422: a key no ConfigMap may have), one fine. The fine one is made; the status says the two
    others; a retry meeting the same two writes no status and sends no Event. Returns the gateway."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        gw = await _gateway(kube, namespace)
        key = key_of(gw)
        ours = {LABEL_OWNER_UID: str(gw["metadata"]["uid"])}
        await kube.create(CONFIGMAPS, _config_map(namespace, "taken", THEIRS, {"theirs": "x"}), namespace)
        content = "plan-content-never-in-a-status"
        taken = diff.Create(_config_map(namespace, "taken", ours, {"plan": content}))
        invalid = diff.Create(_config_map(namespace, "invalid", ours, {"not a key!": content}))
        fine = diff.Create(_config_map(namespace, "fine", ours, {"plan": content}))
        counts = await execute.apply(
            kube, key, gw, _decision(gw, [taken, invalid, fine], NOW), now=NOW, reporter="test"
        )
        assert [(f.name, f.code, f.reason) for f in counts.failures] == [
            (f"{namespace}/taken", 409, "AlreadyExists"),
            (f"{namespace}/invalid", 422, "Invalid"),
        ]
        assert await kube.get(CONFIGMAPS, "fine", namespace) is not None, "every write it can is made"
        theirs = await kube.get(CONFIGMAPS, "taken", namespace)
        assert theirs["data"] == {"theirs": "x"}, "someone else's object is never touched"

        gw = await kube.get(VPNGATEWAYS, key.name, namespace)
        owned = conditions(gw)["OwnedObjects"]
        assert owned["status"] == "False" and owned["reason"] == "AlreadyExists"
        assert f"create ConfigMap {namespace}/taken: AlreadyExists: " in owned["message"]
        assert "labels app.kubernetes.io/managed-by=someone-else; ownerReferences none" in owned["message"]
        assert f"create ConfigMap {namespace}/invalid: Invalid: " in owned["message"]
        assert "not a key!" in owned["message"], "the API's message names the bad key"
        assert content not in str(gw["status"]), "never the object's content"
        assert conditions(gw)["Ready"]["status"] == "False"
        warned = [e["reason"] for e in await _events_of(kube, gw) if e["type"] == "Warning"]
        assert warned.count("AlreadyExists") == 1, warned

        # The retry: decided on the status just written (as a fresh cache has it), the same refusals.
        counts = await execute.apply(
            kube, key, gw, _decision(gw, [taken, invalid], LATER), now=LATER, reporter="test"
        )
        assert len(counts.failures) == 2 and counts.writes == 0, "nothing new to say: no write"
        again = await kube.get(VPNGATEWAYS, key.name, namespace)
        assert again["metadata"]["resourceVersion"] == gw["metadata"]["resourceVersion"]
        warned = [e["reason"] for e in await _events_of(kube, gw) if e["type"] == "Warning"]
        assert warned.count("AlreadyExists") == 1, f"no second Event for the same failure: {warned}"
        return dict(again)


async def a_status_decided_on_a_stale_read_is_requeued(kubeconfig: Path, namespace: str) -> None:
    """The gateway read, then its status written by another (the controller's own last write, not yet in
    its cache): the status decided on the read is refused (409: Requeue), the newer one stays, and the
    Event that status would have caused is not sent. Decided again on a fresh read, it goes."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        stale = await _gateway(kube, namespace)
        key = key_of(stale)
        newer = {
            "type": "ConfigRendered",
            "status": "True",
            "reason": "Rendered",
            "message": "newer",
            "lastTransitionTime": NOW,
            "observedGeneration": 1,
        }
        await kube.patch(
            VPNGATEWAYS, key.name, {"status": {"conditions": [newer]}}, namespace, subresource="status"
        )
        failing = [Condition("ConfigRendered", False, "SecretNotOptedIn", "from the stale read")]
        decision = _decision(stale, [], LATER, failing)
        assert decision.status is not None and decision.events, "the stale read asks for a write and an Event"
        with pytest.raises(execute.Requeue):
            await execute.apply(kube, key, stale, decision, now=LATER, reporter="test")
        now = await kube.get(VPNGATEWAYS, key.name, namespace)
        assert now["status"]["conditions"] == [newer], "the newer status is not overwritten"
        assert await _events_of(kube, stale) == [], "no Event for a status never written"

        fresh = _decision(now, [], LATER, failing)
        await execute.apply(kube, key, now, fresh, now=LATER, reporter="test")
        done = await kube.get(VPNGATEWAYS, key.name, namespace)
        assert conditions(done)["ConfigRendered"]["reason"] == "SecretNotOptedIn"
        assert [e["reason"] for e in await _events_of(kube, stale)].count("SecretNotOptedIn") == 1


async def a_status_agent_write_meanwhile_does_not_hold_the_status_back(
    kubeconfig: Path, namespace: str
) -> None:
    """The gateway read, then the status-agent's own keys written (every ~30 s per gateway): the version
    the decision saw is gone (409), but what it decided on (the generation, the controller's keys) is not,
    so the status is written all the same (once, with its Event), the agent's keys kept."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        read = await _gateway(kube, namespace)
        key = key_of(read)
        tunnels = [{"name": "s1", "state": "Established"}]
        await kube.patch(
            VPNGATEWAYS, key.name, {"status": {"tunnels": tunnels}}, namespace, subresource="status"
        )
        failing = [Condition("ConfigRendered", False, "SecretNotOptedIn", "the agent wrote meanwhile")]
        await execute.apply(kube, key, read, _decision(read, [], LATER, failing), now=LATER, reporter="test")
        done = await kube.get(VPNGATEWAYS, key.name, namespace)
        assert conditions(done)["ConfigRendered"]["reason"] == "SecretNotOptedIn"
        assert done["status"]["tunnels"] == tunnels, "the agent's keys are not touched"
        assert [e["reason"] for e in await _events_of(kube, read)].count("SecretNotOptedIn") == 1
