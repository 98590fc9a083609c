"""gwkit.httpd's pure decisions: the descriptor budget of a server and the deadline of a reply."""

from __future__ import annotations

import resource

import pytest

from gwkit.httpd import FD_RESERVE, Limits, open_files

INF = resource.RLIM_INFINITY


@pytest.mark.parametrize(
    ("connections", "soft", "hard", "expected"),
    [
        pytest.param(1024, 4096, 4096, (4096, 1024), id="enough-already"),
        pytest.param(1024, 1024, 524288, (1024 + FD_RESERVE, 1024), id="raised-as-far-as-needed"),
        pytest.param(1024, 1024, INF, (1024 + FD_RESERVE, 1024), id="unlimited-hard"),
        pytest.param(1024, 1024, 1024, (1024, 1024 - FD_RESERVE), id="hard-too-low-holds-fewer"),
        pytest.param(1024, 256, 300, (300, 300 - FD_RESERVE), id="hard-just-above-the-reserve"),
        pytest.param(1024, 64, 64, (64, 1), id="never-below-one"),
    ],
)
def test_open_files(connections: int, soft: int, hard: int, expected: tuple[int, int]) -> None:
    assert open_files(connections, soft, hard) == expected


@pytest.mark.parametrize(
    ("size", "seconds"),
    [
        pytest.param(3, 5.0 + 3 / 262144, id="a-probe-answer-gets-the-grace"),
        pytest.param(4 * 1024 * 1024, 5.0 + 16.0, id="4-MiB-at-256-KiB-per-s"),
    ],
)
def test_the_send_deadline_grows_with_the_reply(size: int, seconds: float) -> None:
    assert Limits().send_deadline(size) == pytest.approx(seconds)
