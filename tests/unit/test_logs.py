"""gwkit.logs: one line format for every program (RFC 3339, UTC, milliseconds, Z), the same quiet
libraries, and the "still waiting" reminder throttle."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from gwkit.logs import KEYS, LEVELS, QUIET, Reminder, rfc3339, setup_logging

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) \S+ ")


@pytest.mark.parametrize(
    "created, text",
    [
        pytest.param(0.0, "1970-01-01T00:00:00.000Z", id="epoch"),
        pytest.param(1_796_113_360.911, "2026-12-01T08:22:40.911Z", id="milliseconds"),
        pytest.param(1_796_113_360.0004, "2026-12-01T08:22:40.000Z", id="below-a-millisecond"),
        pytest.param(1_796_113_359.9996, "2026-12-01T08:22:39.999Z", id="truncated-not-rounded-up"),
    ],
)
def test_rfc3339(created: float, text: str) -> None:
    assert rfc3339(created) == text


@pytest.fixture
def root_logging() -> Iterator[None]:
    """setup_logging changes the root logger: put back what pytest had."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(False)


@pytest.mark.usefixtures("root_logging")
def test_setup_logging_one_handler_one_format_and_quiet_libraries() -> None:
    first, out = io.StringIO(), io.StringIO()
    setup_logging("INFO", stream=first)
    setup_logging("DEBUG", stream=out)  # a second call replaces, never duplicates
    logging.getLogger("agent.test").debug("thing.happened n=%d", 1)
    logging.getLogger("urllib3.connectionpool").info("Starting new HTTPS connection")
    logging.getLogger("kubernetes.client").debug("chatter")
    lines = out.getvalue().splitlines()
    assert first.getvalue() == ""
    assert len(lines) == 1 and LINE.match(lines[0]), lines
    assert lines[0].endswith(" DEBUG agent.test thing.happened n=1")
    assert all(logging.getLogger(n).level == logging.WARNING for n in QUIET)


@pytest.mark.usefixtures("root_logging")
def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of DEBUG, INFO, WARNING, ERROR"):
        setup_logging("LOUD")
    assert LEVELS == ("DEBUG", "INFO", "WARNING", "ERROR")


def test_reminder_at_once_then_every_period_and_again_on_a_new_reason() -> None:
    now = [100.0]
    r = Reminder(every=5.0, clock=lambda: now[0])
    said = []
    for t in [100.0, 101.0, 104.9, 105.0, 106.0, 110.0, 110.5]:
        now[0] = t
        if r.due("no plan"):
            said.append(t)
    assert said == [100.0, 105.0, 110.0]
    assert r.waited() == 10.5
    now[0] = 111.0
    assert r.due("plan invalid: version"), "a new reason is said at once"
    assert not r.due("plan invalid: version")
    r.clear()
    assert r.waited() == 0.0
    now[0] = 111.5
    assert r.due("plan invalid: version"), "after clear() the wait starts over"


@pytest.mark.usefixtures("root_logging")
def test_json_lines_have_the_same_keys_every_time() -> None:
    out = io.StringIO()
    setup_logging("INFO", stream=out, fmt="json")
    log = logging.getLogger("controller.run")
    log.info("gateway.reconciled gateway=%s writes=%d", "t/a", 3)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("gateway.crashed gateway=%s", "t/b")
    log.warning("")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [tuple(d) for d in lines] == [KEYS] * 3  # one object per line, a traceback inside its message
    first, crashed, empty = lines
    assert first == {
        "time": first["time"],
        "level": "INFO",
        "logger": "controller.run",
        "event": "gateway.reconciled",
        "message": "gateway.reconciled gateway=t/a writes=3",
    }
    assert LINE.match(first["time"] + " INFO x ")
    assert crashed["event"] == "gateway.crashed" and "ValueError: boom" in crashed["message"]
    assert empty["event"] == ""


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format 'xml'"):
        setup_logging("INFO", fmt="xml")


def test_a_library_that_resets_its_level_after_set_up_still_logs_nothing_below_warning() -> None:
    """pyroute2 sets its logger to NOTSET when imported (pyroute2/config/log.py), possibly after the
    program's set-up: at --log-level DEBUG its netlink core then logged WireGuard set requests, private
    key and PSKs included (found in the kernel tier)."""
    stream = io.StringIO()
    try:
        setup_logging("DEBUG", stream=stream)
        logging.getLogger("pyroute2").setLevel(logging.NOTSET)  # what importing pyroute2 does
        logging.getLogger("pyroute2.netlink.core").debug("message: private_key=SECRETKEY")
        logging.getLogger("pyroute2.netlink.core").warning("netlink: a warning stays")
        logging.getLogger("agent").debug("agent.debug stays")
        out = stream.getvalue()
        assert "SECRETKEY" not in out
        assert "a warning stays" in out and "agent.debug stays" in out
    finally:
        setup_logging("INFO")
