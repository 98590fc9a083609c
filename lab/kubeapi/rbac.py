"""Authorization as kube-apiserver's RBAC authorizer and its escalation checks decide it (pure functions).

Inputs are snapshots of the RBAC objects (plain dicts as stored); outputs are decisions and messages. The
``system:masters`` group is allowed everything (kube-apiserver's privileged-group authorizer). Otherwise:
ClusterRoleBindings grant their ClusterRole everywhere, RoleBindings grant their Role or ClusterRole in the
binding's namespace only; rules match on apiGroups, resources (``*``, ``res``, ``res/sub``, ``*/sub``),
verbs (``*``), resourceNames (never for create, and for list/watch only via a ``metadata.name`` field
selector, which the HTTP layer turns into the request's name), and nonResourceURLs (exact, ``*``,
``prefix*``). ClusterRoles with an aggregationRule get the rules of the ClusterRoles their selectors match.
Escalation: creating/updating a Role/ClusterRole needs every right it grants (or ``escalate``); a binding
needs the referenced role's rights (or ``bind`` on that role) - ``validation.Covers`` semantics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.kubeapi.selectors import match_labels, selector_from_label_selector

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
SA_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def privileged(self) -> bool:
        return MASTERS in self.groups


def service_account_user(namespace: str, name: str, uid: str = "") -> UserInfo:
    """The identity of a ServiceAccount token, with the groups Kubernetes gives it."""
    return UserInfo(
        f"{SA_PREFIX}{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
        uid,
    )


@dataclass(frozen=True)
class Attributes:
    """authorizer.Attributes of one request."""

    user: UserInfo
    verb: str
    resource_request: bool = True
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


@dataclass(frozen=True)
class Snapshot:
    """The RBAC objects in force: dicts as stored."""

    roles: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    cluster_roles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    role_bindings: Sequence[Mapping[str, Any]] = ()
    cluster_role_bindings: Sequence[Mapping[str, Any]] = ()


Rule = Mapping[str, Any]

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_PLURALS = ("roles", "clusterroles", "rolebindings", "clusterrolebindings")


@dataclass
class LaggingCache:
    """The RBAC authorizer's view when RBAC changes take ``delay`` seconds to be seen: kube-apiserver's
    authorizer reads Roles, ClusterRoles and their bindings from informer caches (kubernetes
    plugin/pkg/auth/authorizer/rbac/rbac.go ``RBACAuthorizer`` over the listers that
    pkg/kubeapiserver/authorizer/config.go ``New`` gets from the shared informer factory), so a write is
    authorized against only once the watch has delivered it. Each watch event is offered with the time it
    happened and applied when it is ``delay`` old - pure, the clock is the caller's."""

    delay: float
    objects: dict[tuple[str, str, str], Mapping[str, Any]] = field(default_factory=dict)
    pending: list[tuple[float, str, str, Mapping[str, Any]]] = field(default_factory=list)

    @staticmethod
    def _key(plural: str, obj: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = obj.get("metadata") or {}
        return plural, str(meta.get("namespace", "")), str(meta.get("name", ""))

    def offer(
        self, now: float, plural: str, etype: str, obj: Mapping[str, Any], *, synced: bool = False
    ) -> None:
        """A watch event of ``plural`` at ``now``; ``synced``: part of the initial list, seen at once."""
        if synced:
            self._apply(plural, etype, obj)
        else:
            self.pending.append((now + self.delay, plural, etype, obj))

    def _apply(self, plural: str, etype: str, obj: Mapping[str, Any]) -> None:
        if etype == "DELETED":
            self.objects.pop(self._key(plural, obj), None)
        else:
            self.objects[self._key(plural, obj)] = obj

    def snapshot(self, now: float) -> Snapshot:
        while self.pending and self.pending[0][0] <= now:
            _, plural, etype, obj = self.pending.pop(0)
            self._apply(plural, etype, obj)

        def of(plural: str) -> list[Mapping[str, Any]]:
            return [o for (p, _, _), o in self.objects.items() if p == plural]

        return Snapshot(
            roles={(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in of("roles")},
            cluster_roles={o["metadata"]["name"]: o for o in of("clusterroles")},
            role_bindings=of("rolebindings"),
            cluster_role_bindings=of("clusterrolebindings"),
        )


def _applies(subject: Mapping[str, Any], user: UserInfo, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return bool(subject.get("name") == user.name)
    if kind == "Group":
        return subject.get("name") in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"{SA_PREFIX}{ns}:{subject.get('name')}"
    return False


def _cluster_role_rules(snap: Snapshot, name: str, errors: list[str]) -> list[Rule]:
    role = snap.cluster_roles.get(name)
    if role is None:
        errors.append(f'clusterrole.rbac.authorization.k8s.io "{name}" not found')
        return []
    agg = role.get("aggregationRule")
    if agg:
        rules: list[Rule] = list(role.get("rules") or [])
        for sel in agg.get("clusterRoleSelectors") or []:
            req = selector_from_label_selector(sel)
            for other in snap.cluster_roles.values():
                if other is not role and not other.get("aggregationRule") and match_labels(req, other):
                    rules.extend(other.get("rules") or [])
        return rules
    return list(role.get("rules") or [])


def rules_for(user: UserInfo, namespace: str, snap: Snapshot) -> tuple[list[Rule], list[str]]:
    """Every rule that applies to ``user`` in ``namespace`` ('' = cluster scope only) + resolution errors."""
    rules: list[Rule] = []
    errors: list[str] = []
    for crb in snap.cluster_role_bindings:
        if any(_applies(s, user, "") for s in crb.get("subjects") or []):
            rules.extend(_cluster_role_rules(snap, (crb.get("roleRef") or {}).get("name", ""), errors))
    if namespace:
        for rb in snap.role_bindings:
            rb_ns = (rb.get("metadata") or {}).get("namespace", "")
            if rb_ns != namespace or not any(_applies(s, user, rb_ns) for s in rb.get("subjects") or []):
                continue
            ref = rb.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                rules.extend(_cluster_role_rules(snap, ref.get("name", ""), errors))
            else:
                role = snap.roles.get((namespace, ref.get("name", "")))
                if role is None:
                    errors.append(f'role.rbac.authorization.k8s.io "{ref.get("name", "")}" not found')
                else:
                    rules.extend(role.get("rules") or [])
    return rules, errors


def _has(values: Iterable[str] | None, wanted: str, star: str = "*") -> bool:
    vs = list(values or [])
    return star in vs or wanted in vs


def _resource_matches(rule: Rule, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.get("resources") or []:
        if r == "*" or r == combined:
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def _url_matches(rule: Rule, path: str) -> bool:
    for u in rule.get("nonResourceURLs") or []:
        if u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])):
            return True
    return False


def rule_allows(rule: Rule, a: Attributes) -> bool:
    if not _has(rule.get("verbs"), a.verb):
        return False
    if not a.resource_request:
        return _url_matches(rule, a.path)
    if not _has(rule.get("apiGroups"), a.group):
        return False
    if not _resource_matches(rule, a.resource, a.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


def authorize(a: Attributes, snap: Snapshot) -> tuple[bool, str]:
    """(allowed, reason): reason names RBAC resolution errors (as the real authorizer's reason does)."""
    if a.user.privileged:
        return True, ""
    rules, errors = rules_for(a.user, a.namespace if a.resource_request else "", snap)
    if any(rule_allows(r, a) for r in rules):
        return True, ""
    return False, ("RBAC: " + ", ".join(errors)) if errors else ""


def forbidden_message(a: Attributes) -> str:
    """responsewriters.forbiddenMessage."""
    if not a.resource_request:
        return f'User "{a.user.name}" cannot {a.verb} path "{a.path}"'
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    if a.namespace:
        return (
            f'User "{a.user.name}" cannot {a.verb} resource "{resource}" in API group "{a.group}" '
            f'in the namespace "{a.namespace}"'
        )
    return (
        f'User "{a.user.name}" cannot {a.verb} resource "{resource}" in API group "{a.group}" '
        "at the cluster scope"
    )


# --- escalation -----------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class SimpleRule:
    """One verb on one group/resource/name, or one verb on one URL (validation.BreakdownRule)."""

    group: str | None
    resource: str | None
    name: str | None
    url: str | None
    verb: str


def breakdown(rule: Rule) -> list[SimpleRule]:
    out: list[SimpleRule] = []
    for verb in rule.get("verbs") or []:
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                for n in rule.get("resourceNames") or [None]:
                    out.append(SimpleRule(g, r, n, None, verb))
        for u in rule.get("nonResourceURLs") or []:
            out.append(SimpleRule(None, None, None, u, verb))
    return out


def _resource_covers(owner: Sequence[str], resource: str) -> bool:
    if "*" in owner or resource in owner:
        return True
    if "/" not in resource:
        return False
    return "*/" + resource.split("/", 1)[1] in owner


def _covers(owner: Rule, s: SimpleRule) -> bool:
    if not _has(owner.get("verbs"), s.verb):
        return False
    if s.url is not None:
        return any(
            u == "*" or u == s.url or (u.endswith("*") and s.url.startswith(u[:-1]))
            for u in owner.get("nonResourceURLs") or []
        )
    if not _has(owner.get("apiGroups"), s.group or ""):
        return False
    if not _resource_covers(list(owner.get("resources") or []), s.resource or ""):
        return False
    names = owner.get("resourceNames") or []
    return not names or (s.name is not None and s.name in names)


def missing_rights(owner_rules: Sequence[Rule], requested: Sequence[Rule]) -> list[SimpleRule]:
    """The simple rules of ``requested`` that ``owner_rules`` do not cover (validation.Covers)."""
    return [s for r in requested for s in breakdown(r) if not any(_covers(o, s) for o in owner_rules)]


def _q(values: Sequence[str]) -> str:
    return "[" + " ".join('"' + v + '"' for v in values) + "]"


def compact(missing: Sequence[SimpleRule]) -> list[str]:
    """PolicyRule.CompactString of the compacted missing rules, sorted."""
    grouped: dict[tuple[str | None, str | None, str | None, str | None], list[str]] = {}
    for s in missing:
        verbs = grouped.setdefault((s.group, s.resource, s.name, s.url), [])
        if s.verb not in verbs:
            verbs.append(s.verb)
    lines = []
    for (g, r, n, u), verbs in grouped.items():
        parts = []
        if g is not None:
            parts.append(f"APIGroups:{_q([g])}")
        if r is not None:
            parts.append(f"Resources:{_q([r])}")
        if u is not None:
            parts.append(f"NonResourceURLs:{_q([u])}")
        if n is not None:
            parts.append(f"ResourceNames:{_q([n])}")
        parts.append(f"Verbs:{_q(verbs)}")
        lines.append("{" + ", ".join(parts) + "}")
    return sorted(lines)


def escalation_message(user: UserInfo, missing: Sequence[SimpleRule], errors: Sequence[str] = ()) -> str:
    msg = (
        f'user "{user.name}" (groups={_q(list(user.groups))}) is attempting to grant RBAC permissions not '
        "currently held:\n" + "\n".join(compact(missing))
    )
    if errors:
        msg += f"; resolution errors: [{' '.join(errors)}]"
    return msg


def role_rules(snap: Snapshot, ref: Mapping[str, Any], namespace: str) -> tuple[list[Rule], list[str]]:
    """The rules a roleRef points at (for the bind check)."""
    errors: list[str] = []
    if ref.get("kind") == "ClusterRole":
        return _cluster_role_rules(snap, ref.get("name", ""), errors), errors
    role = snap.roles.get((namespace, ref.get("name", "")))
    if role is None:
        return [], [f'role.rbac.authorization.k8s.io "{ref.get("name", "")}" not found']
    return list(role.get("rules") or []), errors


# --- the default bootstrap policy (the part that authenticated users rely on) -----------------------

DISCOVERY_URLS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
)
PUBLIC_URLS = ("/healthz", "/livez", "/readyz", "/version", "/version/")


def bootstrap_policy() -> list[dict[str, Any]]:
    """cluster-admin, system:discovery, system:basic-user, system:public-info-viewer and their bindings."""
    auto = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    annotations = {"rbac.authorization.kubernetes.io/autoupdate": "true"}

    def cr(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(auto), "annotations": dict(annotations)},
            "rules": rules,
        }

    def crb(name: str, groups: Sequence[str]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(auto), "annotations": dict(annotations)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups
            ],
        }

    return [
        cr(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
        cr("system:discovery", [{"nonResourceURLs": list(DISCOVERY_URLS), "verbs": ["get"]}]),
        cr(
            "system:basic-user",
            [
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"],
                    "verbs": ["create"],
                },
            ],
        ),
        cr("system:public-info-viewer", [{"nonResourceURLs": list(PUBLIC_URLS), "verbs": ["get"]}]),
        crb("cluster-admin", [MASTERS]),
        crb("system:discovery", [AUTHENTICATED]),
        crb("system:basic-user", [AUTHENTICATED]),
        crb("system:public-info-viewer", [AUTHENTICATED, UNAUTHENTICATED]),
    ]
