"""HTTP routes: /metrics (Prometheus text, or OpenMetrics when the Accept header asks), /healthz, /readyz, /.

``/healthz`` is the exporter's own liveness: always 200 while it serves (a daemon being down is a metric,
``*_up 0``, not ill health). ``/readyz`` is 503 with the reason until the ``--plan`` file has been read
valid once (``PlanFile.readiness``), then 200; without ``--plan`` always 200.

Every ``/metrics`` also carries ``vpngw_build_info{version,program="exporter"} 1`` (the controller and the
agent say the same of themselves), so that a dashboard or an alert can tell which release runs where.
"""

from __future__ import annotations

from itertools import chain

from exporter.collector import families
from exporter.family import Family, Renderer
from exporter.http import Response, content_type, wants_openmetrics
from exporter.service import Exporter
from gwkit.version import version

INDEX = b"vpngw exporter: /metrics (Prometheus text or OpenMetrics), /healthz, /readyz\n"


def build_info(release: str) -> Family:
    """``vpngw_build_info`` of the exporter (pure)."""
    fam = Family.gauge("vpngw_build_info", "1, labelled with the program's version.", ("version", "program"))
    fam.add_metric((release, "exporter"), 1)
    return fam


class MetricsApp:
    def __init__(self, exporter: Exporter, renderer: Renderer | None = None) -> None:
        self.exporter = exporter
        self.renderer = renderer or Renderer()
        self.build = build_info(version())

    async def __call__(self, method: str, path: str, headers: dict[str, str]) -> Response:
        if path == "/metrics":
            snap = await self.exporter.snapshot()
            om = wants_openmetrics(headers.get("accept", ""))
            return Response(
                200,
                content_type(om),
                self.renderer.render(chain(families(snap), (self.build,)), openmetrics=om),
            )
        if path == "/healthz":
            # Liveness of the exporter itself: a daemon being down is a metric (*_up 0), not ill health.
            return Response(200, "text/plain; charset=utf-8", b"ok\n")
        if path == "/readyz":
            ready, reason = self.exporter.plan.readiness()
            body = f"{'ready' if ready else 'not ready'}: {reason}\n".encode()
            return Response(200 if ready else 503, "text/plain; charset=utf-8", body)
        if path == "/":
            return Response(200, "text/plain; charset=utf-8", INDEX)
        return Response(404, "text/plain; charset=utf-8", b"not found\n")
