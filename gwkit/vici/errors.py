"""Errors of the VICI boundary, translated once in ``session.py``.

::

    ViciError                    talking to charon failed
    ├── ViciUnavailable          socket missing, refused or closed mid-message: reconnect with backoff
    │   └── ViciTimeout          no answer before the deadline; the stream is desynchronised, so the
    │                            session that timed out is discarded
    └── ViciCommandFailed        charon answered success=no: the same input will fail again
"""

from __future__ import annotations


class ViciError(Exception):
    """Talking to charon failed."""


class ViciUnavailable(ViciError):
    """Socket missing, refused or closed mid-message: reconnect with backoff."""


class ViciTimeout(ViciUnavailable):
    """charon did not answer before the deadline (e.g. SIGSTOPped); the session is discarded."""


class ViciCommandFailed(ViciError):
    """charon replied ``success: no``. ``log`` holds the control-log lines streamed with the command,
    which carry the real cause (e.g. ``received AUTHENTICATION_FAILED notify error``)."""

    def __init__(self, command: str, message: str, log: tuple[str, ...] = ()) -> None:
        super().__init__(f"{command}: {message}")
        self.command = command
        self.message = message
        self.log = log
