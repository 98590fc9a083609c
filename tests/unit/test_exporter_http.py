"""exporter.http / exporter.sources (pure parts): Accept negotiation, request parsing, backoff."""

from __future__ import annotations

import pytest

from exporter.http import Response, parse_request, response_head, wants_openmetrics
from exporter.sources import backoff

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    "accept, expected",
    [
        pytest.param(PROMETHEUS_ACCEPT, True, id="prometheus-2"),
        pytest.param("text/plain;version=0.0.4", False, id="classic"),
        pytest.param("", False, id="none"),
        pytest.param("*/*", False, id="curl"),
        pytest.param("application/openmetrics-text; version=1.0.0; q=0", False, id="refused"),
    ],
)
def test_wants_openmetrics(accept: str, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


def test_parse_request() -> None:
    head = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/plain"
    assert parse_request(head) == ("GET", "/metrics", {"host": "a", "accept": "text/plain"})


@pytest.mark.parametrize("head", [b"garbage", b"GET / SPDY/3\r\n", b"GET / HTTP/1.1\r\nno-colon"])
def test_parse_request_rejects_garbage(head: bytes) -> None:
    with pytest.raises(ValueError):
        parse_request(head)


def test_response_head_announces_the_body_without_carrying_it() -> None:
    head = response_head(Response(200, "text/plain", b"hello"))
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"Content-Length: 5\r\nConnection: close\r\n\r\n")


@pytest.mark.parametrize("failures, delay", [(0, 0.0), (1, 0.25), (2, 0.5), (4, 2.0), (6, 5.0), (60, 5.0)])
def test_backoff(failures: int, delay: float) -> None:
    assert backoff(failures) == delay
