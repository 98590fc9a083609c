"""The VICI boundary: an async client for charon's control socket (shared by the agent and exporter)."""

from agent.vici.errors import ViciCommandFailed, ViciError, ViciTimeout, ViciUnavailable
from agent.vici.session import ViciSession

__all__ = ["ViciCommandFailed", "ViciError", "ViciSession", "ViciTimeout", "ViciUnavailable"]
