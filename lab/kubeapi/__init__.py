"""An EMULATOR of the Kubernetes API server for tests and demos (not Kubernetes; see docs/kubeapi.md).

Start it in-process with ``async with KubeAPI() as api`` (or ``with KubeAPIThread() as api`` from sync
code), or as a process with ``python -m lab.kubeapi --listen 127.0.0.1:0 --kubeconfig PATH``.
"""

from lab.kubeapi.controls import Fault, RequestRecord
from lab.kubeapi.emulator import KubeAPI, KubeAPIThread
from lab.kubeapi.server import Settings

__all__ = ["Fault", "KubeAPI", "KubeAPIThread", "RequestRecord", "Settings"]
