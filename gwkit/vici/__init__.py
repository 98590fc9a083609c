"""The VICI boundary: an async client for charon's control socket (shared by the agent and exporter)."""

from gwkit.vici.errors import ViciCommandFailed, ViciError, ViciTimeout, ViciUnavailable
from gwkit.vici.session import ViciSession

__all__ = ["ViciCommandFailed", "ViciError", "ViciSession", "ViciTimeout", "ViciUnavailable"]
