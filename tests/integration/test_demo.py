"""`make demo`, shortened: the whole pipeline on live daemons, as a user sees it.

controller render (CRs -> plan) -> init-nat (policy routing + NAT in a pod-like namespace with NIC2 named
ens7) -> agent (charon over VICI) -> exporter, with two kill -9s of charon that the agent must recover
from by itself, and an exposure reached through the tunnels from both remote sites.
"""

from __future__ import annotations

import io
import re

import pytest

from lab import netns
from lab.demo import run

pytestmark = pytest.mark.lab


def test_demo_recovers_every_tunnel_after_charon_is_killed() -> None:
    before = set(netns.list_namespaces())
    out = io.StringIO()
    assert run(duration=16, kill_every=6, out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert len(re.findall(r"every tunnel re-established by the agent", text)) >= 2, text
    assert "reachable from: s1, s2" in text, text
    assert re.search(r'strongswan_tunnel_up\{tunnel="s1"\} 1', text), text
    assert "demo-only-psk" not in text
    assert set(netns.list_namespaces()) <= before | set(), "the demo left namespaces behind"
