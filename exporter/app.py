"""HTTP routes: /metrics (Prometheus text, or OpenMetrics when the Accept header asks), /healthz, /readyz, /.

``/healthz`` is the exporter's own liveness: always 200 while it serves (a daemon being down is a metric,
``*_up 0``, not ill health). ``/readyz`` is 503 with the reason until the ``--plan`` file has been read
valid once (``PlanFile.readiness``), then 200; without ``--plan`` always 200.
"""

from __future__ import annotations

from exporter.collector import families
from exporter.family import Renderer
from exporter.http import Response, content_type, wants_openmetrics
from exporter.service import Exporter

INDEX = b"vpngw exporter: /metrics (Prometheus text or OpenMetrics), /healthz, /readyz\n"


class MetricsApp:
    def __init__(self, exporter: Exporter, renderer: Renderer | None = None) -> None:
        self.exporter = exporter
        self.renderer = renderer or Renderer()

    async def __call__(self, method: str, path: str, headers: dict[str, str]) -> Response:
        if path == "/metrics":
            snap = await self.exporter.snapshot()
            om = wants_openmetrics(headers.get("accept", ""))
            return Response(200, content_type(om), self.renderer.render(families(snap), openmetrics=om))
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
