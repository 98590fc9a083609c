"""initnat.dns: names are looked up as absolute names (never under the resolv.conf search list)."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address
from typing import Any

import pytest

from initnat import dns


def test_a_name_is_looked_up_with_its_trailing_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        asked.append(host)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.71", 0)),
            (2, 1, 6, "", ("192.0.2.70", 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert dns.lookup("api.fabric.example") == IPv4Address("192.0.2.70"), "the lowest address"
    assert dns.lookup("api.fabric.example.") == IPv4Address("192.0.2.70")
    assert asked == ["api.fabric.example.", "api.fabric.example."], "absolute: no search-list expansion"
