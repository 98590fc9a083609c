"""The IPsec keeper's shell without charon: it stays live, reports every tunnel Down with the reason, and
retries with a bounded backoff (sleep injected, so no real waiting). Real-charon behaviour is in
tests/integration/test_agent_ipsec.py."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from agent.fakes import ListSink, StaticPlans
from agent.health import HealthState
from agent.ipsec.keeper import Keeper, Timing
from agent.runtime import SecretError, Secrets
from gwplan import Child, GatewayRef, IkeSecret, Ipsec, Plan, SecretRef, Tunnel
from lab.wait import wait_for_async

pytestmark = pytest.mark.anyio
PSK = b"keeper-component-psk-31f"  # test-only value


class DictSecrets:
    def __init__(self, values: dict[tuple[str, str], bytes]) -> None:
        self.values = values

    def read(self, ref: SecretRef) -> bytes:
        try:
            return self.values[ref.name, ref.key]
        except KeyError:
            raise SecretError(f"secret {ref.name} key {ref.key}: not mounted") from None

    def version(self, ref: SecretRef) -> str:
        return str(hash(self.read(ref)))


_s: Secrets = DictSecrets({})


def plan() -> Plan:
    conn = {"s1": {"version": "2", "children": {"s1-0": {"remote_ts": ["10.1.0.0/24"]}}}}
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="ipsec",
        ipsec=Ipsec(
            secrets=(IkeSecret("psk-s1", ("s1",), SecretRef("psk", "psk")),),
            tunnels=(Tunnel("s1", True, (Child("s1-0", "10.1.0.0/24"),), conn),),
        ),
    )


async def test_without_charon_the_keeper_reports_down_stays_live_and_backs_off(tmp_path: Path) -> None:
    sink, health = ListSink(), HealthState(stale_after=60)
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await anyio.lowlevel.checkpoint()

    keeper = Keeper(
        tmp_path / "charon.vici",  # nothing listens here
        StaticPlans(plan()),
        DictSecrets({("psk", "psk"): PSK}),
        sink,
        health,
        timing=Timing(poll_interval=0.01, debounce=0.0),
        sleep=sleep,
    )
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            await wait_for_async(lambda: len([d for d in delays if d > 0]) >= 8, 10, "8 keeper retries", 0.01)
            tg.cancel_scope.cancel()
    delays = [d for d in delays if d > 0]  # 0: the (disabled) debounce
    assert len(delays) >= 6
    assert delays == sorted(delays) and max(delays) <= 0.25, "bounded, growing backoff"
    (tunnel,) = sink.published[-1]["tunnels"]
    assert tunnel["state"] == "Down" and "charon unreachable" in tunnel["lastError"]
    assert sink.published[-1]["agent"]["connected"] is False
    assert len(sink.published) == 1, "publishes only on change, not on every retry"
    snap = health.snapshot()
    assert not snap.ready and "charon unreachable" in snap.reason
    assert snap.seconds_since_beat is not None and snap.seconds_since_beat < 5
    assert PSK.decode() not in repr(sink.published)
