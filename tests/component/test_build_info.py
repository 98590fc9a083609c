"""``vpngw_build_info{version,program} 1`` on the /metrics of the controller, the exporter and the agent
(each served as in production: the operator's handler, the exporter's app, the agent's probe server)."""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.health import HealthState
from agent.health import serve as serve_probes
from controller.cloud import StaticCloud
from controller.leader import AlwaysLeader
from controller.run import Operator
from controller.settings import Settings
from exporter.app import MetricsApp
from exporter.service import Exporter
from exporter.sources import StrongswanSource
from gwkit.kube import ClusterConfig, KubeClient
from gwkit.version import version

pytestmark = pytest.mark.anyio


def build_info(text: str) -> list[dict[str, str]]:
    return [
        s.labels
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "vpngw_build_info" and s.value == 1
    ]


async def test_the_controller_says_its_version() -> None:
    async with KubeClient(ClusterConfig("https://127.0.0.1:9", False)) as kube:
        operator = Operator(kube, Settings(), StaticCloud({}), AlwaysLeader())
        code, _, body = await operator.http("/metrics")
    assert code == 200
    assert build_info(body.decode()) == [{"version": version(), "program": "controller"}]


async def test_the_exporter_says_its_version(tmp_path: Path) -> None:
    app = MetricsApp(Exporter(strongswan=StrongswanSource(tmp_path / "no-charon.vici")))
    res = await app("GET", "/metrics", {})
    assert res.status == 200
    assert build_info(res.body.decode()) == [{"version": version(), "program": "exporter"}]


async def test_the_agent_says_its_version_on_its_probe_port() -> None:
    async with anyio.create_task_group() as tg:
        port = await tg.start(functools.partial(serve_probes, "127.0.0.1:0", HealthState()))
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"GET /metrics HTTP/1.0\r\n\r\n")
            reply = b""
            with anyio.fail_after(5):
                async for chunk in stream:
                    reply += chunk
        tg.cancel_scope.cancel()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0]
    assert build_info(body.decode()) == [{"version": version(), "program": "agent"}]
    assert b"\nprocess_cpu_seconds_total " in body
