"""Bearer tokens: the admin token (system:masters) and ServiceAccount tokens (TokenRequest).

Tokens are random strings; only their SHA-256 is kept. A ServiceAccount token is valid while it has not
expired and the ServiceAccount it names still exists with the same uid (bound tokens die with their SA).
Unknown, expired or orphaned tokens authenticate nobody: the HTTP layer answers 401.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lab.kubeapi.rbac import AUTHENTICATED, MASTERS, UserInfo, service_account_user

ADMIN = UserInfo("kubernetes-admin", (MASTERS, AUTHENTICATED))


@dataclass(frozen=True)
class TokenRecord:
    user: UserInfo
    expires: datetime | None = None
    sa: tuple[str, str, str] | None = None
    """(namespace, name, uid) of the ServiceAccount a bound token belongs to."""
    audiences: tuple[str, ...] = ()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    def __init__(self) -> None:
        self._records: dict[str, TokenRecord] = {}

    def add(self, record: TokenRecord, token: str | None = None) -> str:
        token = token or secrets.token_urlsafe(32)
        self._records[_digest(token)] = record
        return token

    def mint_service_account(
        self, namespace: str, name: str, uid: str, expires: datetime | None, audiences: tuple[str, ...] = ()
    ) -> str:
        return self.add(
            TokenRecord(
                service_account_user(namespace, name, uid), expires, (namespace, name, uid), audiences
            )
        )

    def authenticate(
        self,
        token: str,
        now: datetime,
        sa_uid: Callable[[str, str], str | None],
    ) -> TokenRecord | None:
        rec = self._records.get(_digest(token))
        if rec is None:
            return None
        if rec.expires is not None and now >= rec.expires:
            return None
        if rec.sa is not None and sa_uid(rec.sa[0], rec.sa[1]) != rec.sa[2]:
            return None
        return rec

    def revoke_all(self) -> None:
        self._records.clear()


def user_info_dict(user: UserInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"username": user.name, "groups": list(user.groups)}
    if user.uid:
        out["uid"] = user.uid
    if user.extra:
        out["extra"] = {k: list(v) for k, v in user.extra.items()}
    return out


def impersonated(name: str, groups: list[str], uid: str, extra: Mapping[str, tuple[str, ...]]) -> UserInfo:
    """The user an impersonation request acts as (ServiceAccount names get their groups)."""
    gs = list(groups)
    if name.startswith("system:serviceaccount:") and not gs:
        ns = name.split(":")[2]
        gs = ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
    if name != "system:anonymous" and AUTHENTICATED not in gs:
        gs.append(AUTHENTICATED)
    return UserInfo(name, tuple(gs), uid, dict(extra))
