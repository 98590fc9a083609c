"""``python -m controller``: help, exit codes, every error on stderr, nothing written on bad input.

Runs the real command in a subprocess (it is what users and the demo run)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gwplan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("args", [["--help"], ["crds", "--help"], ["render", "--help"]])
def test_help_everywhere(args: list[str]) -> None:
    res = run(*args)
    assert res.returncode == 0 and "usage: python -m controller" in res.stdout


def test_usage_errors_exit_2() -> None:
    assert run().returncode == 2
    assert run("render").returncode == 2
    res = run("render", "-f", "/nonexistent.yaml")
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_crds_prints_four_crds_as_multi_document_yaml() -> None:
    res = run("crds")
    assert res.returncode == 0
    docs = list(yaml.safe_load_all(res.stdout))
    assert [d["metadata"]["name"] for d in docs] == [
        "vpngateways.vpn.bnerd.net",
        "vpnpeers.vpn.bnerd.net",
        "ipsecgateways.ipsec.bnerd.net",
        "clusterlinks.ipsec.bnerd.net",
    ]
    assert all(d["kind"] == "CustomResourceDefinition" for d in docs)


def test_render_writes_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    res = run(
        "render",
        "-f",
        str(EXAMPLES / "ipsec.yaml"),
        "--internal-source-cidrs",
        "192.0.2.64/26",
        "-o",
        str(out),
        "--nic-mac",
        "fa:16:3e:00:00:01",
    )
    assert res.returncode == 0, res.stderr
    plan = gwplan.loads(out.read_bytes())
    assert plan.gateway.name == "acme" and plan.nic.mac == "fa:16:3e:00:00:01"
    assert "render.done gateway=VPNGateway/tenant-acme/acme type=ipsec tunnels=2" in res.stderr
    again = run(
        "render",
        "-f",
        "-",
        "--internal-source-cidrs",
        "192.0.2.64/26",
        "--nic-mac",
        "fa:16:3e:00:00:01",
        stdin=(EXAMPLES / "ipsec.yaml").read_text(),
    )
    assert again.stdout.encode() == out.read_bytes(), "stdout and -o give the same bytes"


def test_render_keeps_previous_allocations(tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    assert run("render", "-f", str(EXAMPLES / "wireguard.yaml"), "-o", str(first)).returncode == 0
    docs = list(yaml.safe_load_all((EXAMPLES / "wireguard.yaml").read_text()))
    docs[0]["spec"]["exposures"].insert(
        0, {"name": "aaa", "target": {"address": "10.0.0.9"}, "ports": [{"port": 1}]}
    )
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump_all(docs))
    res = run("render", "-f", str(changed), "--previous", str(first))
    assert res.returncode == 0, res.stderr
    before, after = gwplan.loads(first.read_bytes()), gwplan.loads(res.stdout)
    assert {e.name: e.virtual_ip for e in before.nat.exposures}.items() <= {
        e.name: e.virtual_ip for e in after.nat.exposures
    }.items()


def test_invalid_input_lists_every_error_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "ipsec.yaml").read_text()))
    docs[1]["spec"]["ipsec"]["remoteSubnets"][1] = "192.168.20.0/33"
    docs[0]["spec"]["ipsec"]["pskSecretRef"]["key"] = ".."
    docs[2]["spec"]["ipsec"]["id"] = "bad id"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    out = tmp_path / "plan.json"
    res = run("render", "-f", str(bad), "-o", str(out), "--internal-source-cidrs", "192.0.2.64/26")
    assert res.returncode == 2
    assert not out.exists() and res.stdout == ""
    lines = [line for line in res.stderr.splitlines() if not line[:4].isdigit()]
    assert (
        'VPNPeer/tenant-acme/s1: spec.ipsec.remoteSubnets[1]: "192.168.20.0/33" is not an IPv4 CIDR' in lines
    )
    assert any(
        line.startswith('VPNGateway/tenant-acme/acme: spec.ipsec.pskSecretRef.key: ".."') for line in lines
    )
    assert any(line.startswith('VPNPeer/tenant-acme/s2: spec.ipsec.id: "bad id"') for line in lines)


def test_reverse_exposures_without_internal_cidrs_fail_loud() -> None:
    res = run("render", "-f", str(EXAMPLES / "ipsec.yaml"))
    assert res.returncode == 2 and res.stdout == ""
    assert "reasons=ExposureLeftOut,ReverseExposuresRequireInternalSourceCIDRs" in res.stderr


def test_swanctl_format_and_bad_yaml() -> None:
    res = run(
        "render",
        "-f",
        str(EXAMPLES / "legacy-ipsecgateway.yaml"),
        "--internal-source-cidrs",
        "192.0.2.64/26",
        "--format",
        "swanctl",
    )
    assert res.returncode == 0 and res.stdout.startswith("# swanctl.conf for IPsecGateway/tenant-old/legacy")
    wg = run("render", "-f", str(EXAMPLES / "wireguard.yaml"), "--format", "swanctl")
    assert wg.returncode == 2 and "not an IPsec gateway" in wg.stderr
    junk = run("render", "-f", "-", stdin="a: [unclosed\n")
    assert junk.returncode == 2 and "not YAML" in junk.stderr


def test_unwritable_output_is_a_runtime_failure(tmp_path: Path) -> None:
    res = run(
        "render", "-f", str(EXAMPLES / "wireguard.yaml"), "-o", str(tmp_path / "missing-dir" / "plan.json")
    )
    assert res.returncode == 1 and "render.write_failed" in res.stderr


def test_bad_internal_source_cidrs_are_reported_like_any_input_problem() -> None:
    res = run(
        "render", "-f", str(EXAMPLES / "ipsec.yaml"), "--internal-source-cidrs", "192.0.2.64/26,10.0.0.0/33"
    )
    assert res.returncode == 2 and res.stdout == ""
    assert (
        'operator: --internal-source-cidrs[1]: "10.0.0.0/33" is not an IPv4 CIDR' in res.stderr.splitlines()
    )


@pytest.mark.parametrize(
    "flag, value, rule",
    [
        ("--nic-mac", "fa:16:3e:00:00", "is not a MAC address"),
        ("--nic-address", "10.0.0.5", "is not an IPv4 address with prefix"),
        ("--nic-gateway", "x", "is not an IPv4 address"),
        ("--wireguard-interface", "wg0; rm -rf /", "is not an interface name"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_and_the_rule(flag: str, value: str, rule: str) -> None:
    res = run("render", "-f", str(EXAMPLES / "wireguard.yaml"), flag, value)
    assert res.returncode == 2 and res.stdout == ""
    assert f'error: {flag}: "{value}" {rule}' in res.stderr


def test_a_damaged_previous_plan_names_the_plan_its_gateway_and_the_field(tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    assert run("render", "-f", str(EXAMPLES / "wireguard.yaml"), "-o", str(first)).returncode == 0
    plan = gwplan.loads(first.read_bytes())
    damaged = dataclasses.replace(plan, nat=dataclasses.replace(plan.nat, mark_mask=0x0F0F0000))
    (tmp_path / "damaged.json").write_bytes(gwplan.dumps(damaged))  # a valid hash: only the mask is bad
    res = run("render", "-f", str(EXAMPLES / "wireguard.yaml"), "--previous", str(tmp_path / "damaged.json"))
    assert res.returncode == 2 and res.stdout == ""
    assert (
        'previous plan of VPNGateway/tenant-acme/acme-wg: nat.markMask: "0xf0f0000" is not one contiguous '
        "run of bits: the previous plan is damaged" in res.stderr.splitlines()
    )
    assert "reasons=PreviousPlanInvalid" in res.stderr


def test_a_document_that_is_not_an_object_is_named_by_its_position() -> None:
    text = (EXAMPLES / "wireguard.yaml").read_text() + "\n---\n- just\n- a list\n"
    res = run("render", "-f", "-", stdin=text)
    assert res.returncode == 2
    assert "document 4 of the input: (document): must be an object (got a list)" in res.stderr.splitlines()


def test_yaml_nulls_are_read_as_the_api_server_stores_them() -> None:
    """`field: ~` and `field:` are JSON null: dropped like at admission, so the plan is the same; a
    required field given as null is reported missing, with the reason."""
    text = (EXAMPLES / "wireguard.yaml").read_text()
    plain = run("render", "-f", "-", stdin=text)
    nulls = text.replace("  type: roadWarrior\n", "  type: roadWarrior\n  endpoint: ~\n").replace(
        "  type: wireguard\n", "  type: wireguard\n  ha: {enabled: ~}\n  reverseExposures:\n"
    )
    assert nulls.count("~") == 2 and "reverseExposures:\n" in nulls
    res = run("render", "-f", "-", stdin=nulls)
    assert res.returncode == 0 and plain.returncode == 0, res.stderr
    assert res.stdout == plain.stdout
    missing = run("render", "-f", "-", stdin=text.replace("serviceCIDR: 198.18.0.0/24", "serviceCIDR: ~"))
    assert missing.returncode == 2
    assert (
        "VPNGateway/tenant-acme/acme-wg: spec.serviceCIDR: is required (it is null, and the API server drops "
        "null fields)" in missing.stderr.splitlines()
    )


def test_a_file_that_is_not_utf8_is_named_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"kind: \xff\n")
    res = run("render", "-f", str(bad))
    assert res.returncode == 2 and res.stdout == ""
    assert f"error: {bad}: not UTF-8 text: byte 0xff at offset 6" in res.stderr
    assert "Traceback" not in res.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "controller", "render", "-f", "-"],
        cwd=ROOT,
        capture_output=True,
        input=b"kind: VPNGateway\nname: \xe9t\xe9\n",
        timeout=60,
        check=False,
    )
    assert piped.returncode == 2 and piped.stdout == b""
    assert b"error: -: not UTF-8 text: byte 0xe9 at offset 23" in piped.stderr
    assert b"Traceback" not in piped.stderr


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("x: 2026-02-30\n", "day is out of range for month"),
        ("at: 2026-01-01 25:00:00\n", "hour must be in 0..23"),
        ("[" * 50_000, "nested too deeply"),
    ],
)
def test_yaml_values_python_cannot_hold_are_named_and_exit_2(tmp_path: Path, text: str, problem: str) -> None:
    f = tmp_path / "gw.yaml"
    f.write_text(text)
    res = run("render", "-f", str(f))
    assert res.returncode == 2 and res.stdout == ""
    assert f"error: {f}: not YAML" in res.stderr and problem in res.stderr
    assert "Traceback" not in res.stderr
