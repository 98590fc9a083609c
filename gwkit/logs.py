"""One logging set-up for every program of the project, so that the lines of one pod read alike.

Every line is ``<time> <LEVEL> <logger> <event.name key=value ...>`` on stderr, the time in RFC 3339, UTC,
with milliseconds and ``Z`` (``2026-12-01T08:16:00.911Z``): sortable as text and the same in the agent,
the exporter, init-nat, the controller and the lab, whatever the container's time zone. The libraries
that chatter at INFO/DEBUG (``QUIET``) are held at WARNING in every program, also under ``--log-level
DEBUG``, so that DEBUG shows our own decisions.

Use it once, first thing in ``main``::

    from gwkit.logs import setup_logging
    setup_logging(args.log_level, fmt=args.log_format)   # level: "DEBUG" ... "ERROR"; fmt: "text" or "json"

``--log-format json`` writes the same lines as one JSON object each, always with the same keys (``KEYS``:
``time``, ``level``, ``logger``, ``event`` (the message's first word, the event name by this project's
convention), ``message`` (the whole text, a traceback appended as in text)), for log pipelines that
parse JSON. ``LEVELS`` and ``FORMATS`` are the tuples to give argparse as ``choices``
(``add_log_format_flag`` adds the flag). ``Reminder`` throttles the "still waiting"
lines a program writes while something it needs is missing (a plan file): at once, then every few seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
KEYS = ("time", "level", "logger", "event", "message")
"""The keys of every ``--log-format json`` line, in this order."""
QUIET: tuple[str, ...] = ("asyncio", "kubernetes", "urllib3", "pyroute2", "httpx", "httpcore")
"""Libraries held at WARNING in every program."""


def rfc3339(created: float) -> str:
    """``created`` (unix seconds) as RFC 3339 in UTC with milliseconds and ``Z`` (pure)."""
    t = datetime.fromtimestamp(created, UTC)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


class UtcFormatter(logging.Formatter):
    """``FORMAT`` with ``asctime`` as ``rfc3339``: UTC whatever the process's time zone (TZ,
    /etc/localtime)."""

    def __init__(self, fmt: str = FORMAT) -> None:
        super().__init__(fmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)


class JsonFormatter(UtcFormatter):
    """One JSON object per line with ``KEYS``: the text format's fields, and the event name on its own."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)  # the message, and a traceback when there is one
        return json.dumps(
            {
                "time": rfc3339(record.created),
                "level": record.levelname,
                "logger": record.name,
                "event": message.split(None, 1)[0] if message.strip() else "",
                "message": message,
            },
            ensure_ascii=False,
        )


def add_log_format_flag(parser: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` (default text), for ``setup_logging``'s ``fmt``."""
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="log lines as text ('RFC3339-UTC LEVEL logger event.name key=value ...') or one JSON object "
        "per line with the keys time, level, logger, event, message (default: %(default)s)",
    )


def _not_quiet(record: logging.LogRecord) -> bool:
    """False for a record below WARNING from one of the ``QUIET`` libraries (or their children)."""
    if record.levelno >= logging.WARNING:
        return True
    return not any(record.name == q or record.name.startswith(q + ".") for q in QUIET)


def setup_logging(level: str | int = "INFO", *, stream: TextIO | None = None, fmt: str = "text") -> None:
    """Send every log line (and ``warnings``) to ``stream`` (default: stderr) in the one format (``fmt``:
    ``text`` or ``json``); replaces handlers set up before. ``level``: a name from ``LEVELS`` or a
    ``logging`` level number; raises ValueError for anything else."""
    if isinstance(level, str) and level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else UtcFormatter())
    # A library may reset its own level when it is imported, after this (pyroute2/config/log.py sets
    # 'pyroute2' to 0 = NOTSET): its DEBUG lines then follow the root's level, and pyroute2's netlink
    # core logs whole WireGuard set requests, private key and PSKs included (found in the kernel tier
    # with --log-level DEBUG). The handler drops them whatever the logger's level says.
    handler.addFilter(_not_quiet)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)


class Reminder:
    """When to repeat a "still waiting" line: ``due(reason)`` is True for a new reason at once, then at
    most once every ``every`` seconds while the same reason lasts; ``clear()`` when the wait is over.
    ``clock``: monotonic seconds (injected in tests)."""

    def __init__(self, every: float = 5.0, clock: Callable[[], float] | None = None) -> None:
        self.every = every
        self._clock = clock or time.monotonic
        self._reason: str | None = None
        self._at = 0.0
        self.since: float | None = None
        """When the current wait began (the clock's time), None when not waiting."""

    def due(self, reason: str) -> bool:
        now = self._clock()
        if self.since is None:
            self.since = now
        if reason != self._reason or now - self._at >= self.every:
            self._reason, self._at = reason, now
            return True
        return False

    def waited(self) -> float:
        """Seconds since the wait began (0 when not waiting)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def clear(self) -> None:
        self._reason, self.since = None, None
