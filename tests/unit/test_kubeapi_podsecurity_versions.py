"""PodSecurity versions in the API emulator (lab.kubeapi.podsecurity): an invalid version is ``latest``,
printed so (pod-security-admission api/helpers.go ParseVersion); v1.35 and newer are checked as latest; a
baseline or restricted level at an older version, whose checks differ, is refused loudly (a 500) instead
of a verdict by 1.35's rules."""

from __future__ import annotations

from typing import Any

import pytest

from lab.kubeapi import podsecurity as ps
from lab.kubeapi.errors import ApiError
from lab.kubeapi.store import Store

ENFORCE = "pod-security.kubernetes.io/enforce"
VERSION = "pod-security.kubernetes.io/enforce-version"


def store_with(labels: dict[str, str]) -> Store:
    store = Store(pod_security=True)
    store.create(store.rtype("", "namespaces"), "", {"metadata": {"name": "t", "labels": labels}})
    return store


def pod() -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


@pytest.mark.parametrize("version", ["v1.30.1", "1.30", "v2.0", "v1.030", "Latest", ""])
def test_an_invalid_version_is_latest(version: str) -> None:
    assert ps.policy({ENFORCE: "restricted", VERSION: version}).enforce == ps.LevelVersion(
        "restricted", "latest"
    )
    store = store_with({ENFORCE: "restricted", VERSION: version})
    with pytest.raises(ApiError) as err:
        store.create(store.rtype("", "pods"), "t", pod())
    assert err.value.code == 403
    assert 'violates PodSecurity "restricted:latest": ' in err.value.message


@pytest.mark.parametrize("version", ["v1.35", "v1.36", "v1.100"])
def test_v1_35_and_newer_are_checked_as_latest_and_printed_as_given(version: str) -> None:
    store = store_with({ENFORCE: "restricted", VERSION: version})
    with pytest.raises(ApiError) as err:
        store.create(store.rtype("", "pods"), "t", pod())
    assert err.value.code == 403
    assert f'violates PodSecurity "restricted:{version}": ' in err.value.message


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_an_older_version_is_not_modelled_and_says_so(level: str) -> None:
    store = store_with({ENFORCE: level, VERSION: "v1.30"})
    with pytest.raises(ApiError) as err:
        store.create(store.rtype("", "pods"), "t", pod())
    assert err.value.code == 500, err.value
    assert "not modelled: PodSecurity version v1.30" in err.value.message
    # The warn level too (it follows a stricter enforce, with its version): a workload's template.
    warn_only = store_with(
        {"pod-security.kubernetes.io/warn": level, "pod-security.kubernetes.io/warn-version": "v1.0"}
    )
    with pytest.raises(ApiError) as err:
        warn_only.create(warn_only.rtype("", "pods"), "t", pod())
    assert err.value.code == 500


def test_privileged_at_any_version_admits_everything() -> None:
    store = store_with({ENFORCE: "privileged", VERSION: "v1.0"})
    store.create(store.rtype("", "pods"), "t", pod())
