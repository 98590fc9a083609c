"""With the API emulator's RBAC delay, the ``bind`` and ``escalate`` verbs lag as every authorization does
(the real server asks its authorizer: pkg/registry/rbac BindingAuthorized, RoleEscalationAuthorized),
while the escalation rule check reads storage (ConfirmNoEscalation's rule resolver): a ``bind`` or
``escalate`` just granted does not yet let a Role or binding beyond the writer's rights through, one just
revoked still does, and rights just granted count for the rule check at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lab.kubeapi import KubeAPI
from tests.component.test_kubeapi_http import Kube, _sa_client

pytestmark = pytest.mark.anyio

RB = "/apis/rbac.authorization.k8s.io/v1/namespaces/t"
LAG = 60.0
"""Longer than the test: what is written after ``set_rbac_delay(LAG)`` is never seen by the authorizer."""


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[KubeAPI]:
    async with KubeAPI(kubeconfig=tmp_path / "kubeconfig", rbac_delay=0.0) as a:
        yield a


def role(name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "rules": list(rules)}


def binding(name: str, role_name: str, subject: str = "gw") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": subject}],
    }


SECRETS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
WRITE_RBAC = {
    "apiGroups": ["rbac.authorization.k8s.io"],
    "resources": ["roles", "rolebindings"],
    "verbs": ["create", "delete"],
}


async def _setup(api: KubeAPI, kube: Kube, *, granted: bool) -> Kube:
    """Seen by the authorizer (no delay yet): the SA may write Roles and RoleBindings (and, when
    ``granted``, bind and escalate); "secrets" is a Role whose rights the SA does not hold. Then a lag
    longer than the test."""
    sa = await _sa_client(api, kube, "t", "gw")
    await kube.ok("POST", f"{RB}/roles", role("writer", WRITE_RBAC))
    await kube.ok("POST", f"{RB}/rolebindings", binding("writer", "writer"))
    await kube.ok("POST", f"{RB}/roles", role("secrets", SECRETS))
    await kube.ok("POST", f"{RB}/roles", role("grant", {**WRITE_RBAC, "verbs": ["bind", "escalate"]}))
    if granted:
        await kube.ok("POST", f"{RB}/rolebindings", binding("grant", "grant"))
    api.set_rbac_delay(LAG)
    return sa


async def test_bind_and_escalate_revoked_just_now_still_let_the_writes_through(api: KubeAPI) -> None:
    kube = Kube(api, api.admin_token)
    sa = await _setup(api, kube, granted=True)
    try:
        await kube.ok("DELETE", f"{RB}/rolebindings/grant")
        assert (await sa.req("POST", f"{RB}/rolebindings", binding("b1", "secrets", "other")))[0] == 201
        assert (await sa.req("POST", f"{RB}/roles", role("r1", SECRETS)))[0] == 201
    finally:
        await sa.aclose()
        await kube.aclose()


async def test_bind_and_escalate_granted_just_now_do_not_yet_but_rights_do(api: KubeAPI) -> None:
    kube = Kube(api, api.admin_token)
    sa = await _setup(api, kube, granted=False)
    try:
        await kube.ok("POST", f"{RB}/rolebindings", binding("grant", "grant"))
        code, body = await sa.req("POST", f"{RB}/rolebindings", binding("b2", "secrets", "other"))
        assert code == 403, body
        assert "attempting to grant RBAC permissions not currently held" in str(body), body
        code, body = await sa.req("POST", f"{RB}/roles", role("r2", SECRETS))
        assert code == 403, body
        # Rights granted just now count for the rule check at once (storage), without bind/escalate.
        await kube.ok("POST", f"{RB}/rolebindings", binding("secrets", "secrets"))
        assert (await sa.req("POST", f"{RB}/rolebindings", binding("b3", "secrets", "other")))[0] == 201
        assert (await sa.req("POST", f"{RB}/roles", role("r3", SECRETS)))[0] == 201
    finally:
        await sa.aclose()
        await kube.aclose()
