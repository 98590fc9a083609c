"""The API emulator's RBAC delay over HTTPS (``rbac_delay`` / ``set_rbac_delay``): a binding just made
is refused for its requests until the authorizer's caches have it, a binding just deleted still
allows them as long, the access reviews answer as the authorizer, and 0 is at once again."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lab.kubeapi import KubeAPI
from lab.wait import wait_for_async
from tests.component.test_kubeapi_http import Kube, _sa_client

pytestmark = pytest.mark.anyio

RB = "/apis/rbac.authorization.k8s.io/v1/namespaces/t"
DELAY = 1.0


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[KubeAPI]:
    async with KubeAPI(kubeconfig=tmp_path / "kubeconfig", rbac_delay=DELAY) as a:
        yield a


async def _until(sa: Kube, code: int) -> float:
    """Seconds until the ServiceAccount's list of ConfigMaps answers ``code``."""
    start = time.monotonic()

    async def answers() -> bool:  # polled: the change has no event a client could wait for
        return (await sa.req("GET", "/api/v1/namespaces/t/configmaps"))[0] == code

    await wait_for_async(answers, 10, f"the ServiceAccount's list of ConfigMaps to answer {code}")
    return time.monotonic() - start


async def test_a_binding_takes_effect_after_the_delay_both_ways(api: KubeAPI) -> None:
    kube = Kube(api, api.admin_token)
    sa = await _sa_client(api, kube, "t", "gw")
    try:
        role = {
            "metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        }
        binding = {
            "metadata": {"name": "b"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "gw"}],
        }
        await kube.ok("POST", f"{RB}/roles", role)
        await kube.ok("POST", f"{RB}/rolebindings", binding)
        assert (await sa.req("GET", "/api/v1/namespaces/t/configmaps"))[0] == 403
        review = {
            "spec": {"resourceAttributes": {"namespace": "t", "verb": "list", "resource": "configmaps"}}
        }
        said = await sa.ok("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        assert said["status"]["allowed"] is False
        assert DELAY - 0.3 <= await _until(sa, 200) <= DELAY + 1.0
        await kube.ok("DELETE", f"{RB}/rolebindings/b")
        assert (await sa.req("GET", "/api/v1/namespaces/t/configmaps"))[0] == 200
        assert DELAY - 0.3 <= await _until(sa, 403) <= DELAY + 1.0
        api.set_rbac_delay(0)
        await kube.ok("POST", f"{RB}/rolebindings", binding)
        assert (await sa.req("GET", "/api/v1/namespaces/t/configmaps"))[0] == 200
    finally:
        await sa.aclose()
        await kube.aclose()
