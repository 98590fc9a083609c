"""init-nat's command line and variant detection without a kernel: bad intervals are usage errors, and a
save command that fails (not merely absent) is said out loud, since it can pick the wrong variant."""

from __future__ import annotations

import logging

import pytest

from initnat.__main__ import parse_args
from initnat.iptables import Completed, FakeRunner, detect_variant


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--poll-interval", "0"),
        ("--poll-interval", "-1"),
        ("--poll-interval", "nan"),
        ("--resync", "0.5"),
        ("--resync", "inf"),
        ("--resync", "soon"),
    ],
)
def test_an_interval_out_of_range_is_bad_usage_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--poll-interval -1 used to make --watch spin at full CPU re-reading the plan."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--plan", "p.json", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {value!r} must be between" in capsys.readouterr().err


def test_intervals_in_range_are_taken() -> None:
    args = parse_args(["--plan", "p.json", "--poll-interval", "0.05", "--resync", "86400"])
    assert (args.poll_interval, args.resync) == (0.05, 86400.0)


def test_a_failing_save_is_a_warning_that_names_the_capabilities(caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeRunner(
        {
            "iptables-legacy-save": [
                Completed(1, "", "iptables-legacy-save: Cannot initialize: Permission denied")
            ],
            "iptables-nft-save": [Completed(0, "*filter\n-A FORWARD -j ACCEPT\nCOMMIT\n", "")],
        }
    )
    with caplog.at_level(logging.WARNING):
        assert detect_variant(runner) == "nft"
    (line,) = [r.getMessage() for r in caplog.records if "iptables.save_failed" in r.getMessage()]
    assert "variant=legacy" in line and "Permission denied" in line and "NET_RAW" in line


def test_a_save_that_is_not_installed_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    def missing(argv: object, input: str | None = None) -> Completed:
        raise FileNotFoundError("iptables-legacy-save")

    with caplog.at_level(logging.WARNING):
        assert detect_variant(missing) == "nft"
    assert "save_failed" not in caplog.text
