"""PodSecurity admission: the Pod Security Standards a namespace's ``pod-security.kubernetes.io/*``
labels ask for, checked as k8s.io/pod-security-admission v0.35.4 checks them - pure.

Each check is its ``policy/check_*.go`` function at the newest version (1.35, which ``latest`` means in
kube-apiserver v1.35.4), with its reason and detail in the same words; ``evaluate`` runs them in the
registry's order (``policy/registry.go`` ``populate``: the baseline check IDs sorted, then the restricted
ones sorted, a restricted check replacing the baseline check it overrides), and ``violation`` joins the
failures as ``policy/checks.go`` ``AggregateCheckResult.ForbiddenDetail`` does. What the admission does
with them (``admission/admission.go``): a Pod create, or an update that changes an image or the number
of containers (``isSignificantPodUpdate``), is refused when the ``enforce`` level fails (``ValidatePod``,
``forbiddenResponse``: ``pods "x" is forbidden: violates PodSecurity "restricted:latest": ...``); an
admitted pod, and every create or update of a workload with a pod template (``ValidatePodController``),
gets a warning when the ``warn`` level fails (``would violate PodSecurity ...``). Labels resolve as
``api/helpers.go`` ``PolicyToEvaluate`` does: unset is ``privileged:latest`` (the apiserver's default
configuration, no exemptions), ``warn`` follows a stricter ``enforce`` unless set itself; a version that
does not parse (``ParseVersion``: ``latest`` or ``v1.x``) is ``latest``, and printed so. A version from
v1.35 on is checked as ``latest`` (the registry evaluates a newer version with its newest checks).

Not modelled, and refused loudly rather than answered wrongly: a ``baseline`` or ``restricted`` level at
a version before v1.35 (older versions have other checks): ``modelled`` raises the emulator's 500
``Internal error occurred: not modelled: PodSecurity version v1.30 ...``. Nor modelled: audit
annotations, the warnings a namespace label change gives about existing pods, refusing an invalid label
on the namespace, exemptions."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.kubeapi.errors import internal

PREFIX = "pod-security.kubernetes.io/"
NEWEST_MINOR = 35
"""The version the checks are modelled at (v1.35, pod-security-admission v0.35.4)."""
VERSION = re.compile(r"^v1\.([0-9]|[1-9][0-9]*)$")
"""api/helpers.go versionRegexp."""
LEVELS = ("privileged", "baseline", "restricted")
POD_CONTROLLERS: Mapping[tuple[str, str], tuple[str, ...]] = {
    # admission/admission.go: the resources ValidatePodController reads a template from (those served).
    ("apps", "deployments"): ("spec", "template"),
    ("apps", "replicasets"): ("spec", "template"),
    ("apps", "statefulsets"): ("spec", "template"),
    ("apps", "daemonsets"): ("spec", "template"),
    ("batch", "jobs"): ("spec", "template"),
    ("batch", "cronjobs"): ("spec", "jobTemplate", "spec", "template"),
    ("", "replicationcontrollers"): ("spec", "template"),
    ("", "podtemplates"): ("template",),
}

Obj = Mapping[str, Any]
Result = tuple[str, str]
"""A failed check: (ForbiddenReason, ForbiddenDetail)."""


@dataclass(frozen=True)
class LevelVersion:
    level: str = "privileged"
    version: str = "latest"

    def __str__(self) -> str:
        return f"{self.level}:{self.version}"


@dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion()
    audit: LevelVersion = LevelVersion()
    warn: LevelVersion = LevelVersion()


def _strictness(level: str) -> int:
    return LEVELS.index(level)


def policy(labels: Mapping[str, str] | None) -> Policy:
    """api/helpers.go PolicyToEvaluate with the default (all privileged:latest); a level that does not
    parse is ``restricted`` for enforce and ``privileged`` for audit and warn (fail open), as there."""
    labels = labels or {}

    def level(mode: str, fallback: str) -> str | None:
        v = labels.get(PREFIX + mode)
        if v is None:
            return None
        return v if v in LEVELS else fallback

    def version(mode: str) -> str:
        v = labels.get(f"{PREFIX}{mode}-version", "latest")
        return v if VERSION.match(v) else "latest"  # ParseVersion: latest (and an error) when invalid

    enforce = LevelVersion(level("enforce", "restricted") or "privileged", version("enforce"))
    audit = LevelVersion(level("audit", "privileged") or "privileged", version("audit"))
    warn_level = level("warn", "privileged")
    warn = LevelVersion(warn_level or "privileged", version("warn"))
    enforce_valid = labels.get(PREFIX + "enforce") in LEVELS
    if warn_level is None and enforce_valid and _strictness(enforce.level) > _strictness(warn.level):
        has_warn_version = f"{PREFIX}warn-version" in labels
        warn = LevelVersion(enforce.level, warn.version if has_warn_version else enforce.version)
    return Policy(enforce, audit, warn)


# --- helpers.go, visitor.go -----------------------------------------------------------------------------


def _join_quote(items: Sequence[str]) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def _plural(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


def _containers(spec: Obj) -> Iterator[Obj]:
    """visitContainers: init containers, containers, ephemeral containers, in that order."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, Mapping):
                yield c


def _sc(obj: Obj) -> Obj:
    sc = obj.get("securityContext")
    return sc if isinstance(sc, Mapping) else {}


def _name(c: Obj) -> str:
    return str(c.get("name", ""))


def _user_namespace(spec: Obj) -> bool:
    """relaxPolicyForUserNamespacePod: ``hostUsers: false``."""
    return spec.get("hostUsers") is False


def _windows(spec: Obj) -> bool:
    return (spec.get("os") or {}).get("name") == "windows"


def _setters(pod: bool, containers: Sequence[str]) -> list[str]:
    out = ["pod"] if pod else []
    if containers:
        out.append(f"{_plural('container', 'containers', len(containers))} {_join_quote(containers)}")
    return out


# --- the checks (policy/check_*.go) ---------------------------------------------------------------------

Check = Callable[[Obj, Obj], Result | None]


def app_armor_profile(meta: Obj, spec: Obj) -> Result | None:
    """check_appArmorProfile.go appArmorProfile_1_0."""
    allowed = ("RuntimeDefault", "Localhost")
    bad_values: set[str] = set()
    pod_bad = False
    profile = _sc(spec).get("appArmorProfile")
    if isinstance(profile, Mapping) and profile.get("type") not in allowed:
        pod_bad = True
        bad_values.add(str(profile.get("type", "")))
    bad: list[str] = []
    for c in _containers(spec):
        profile = _sc(c).get("appArmorProfile")
        if isinstance(profile, Mapping) and profile.get("type") not in allowed:
            bad.append(_name(c))
            bad_values.add(str(profile.get("type", "")))
    setters = _setters(pod_bad, bad)
    annotations = sorted(
        f"{k}={_go_quote(str(v))}"
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith("container.apparmor.security.beta.kubernetes.io/")
        and not (v == "" or v == "runtime/default" or str(v).startswith("localhost/"))
    )
    values = sorted(bad_values) + annotations
    if annotations:
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    return (
        _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(values)),
        f"{' and '.join(setters)} must not set AppArmor profile type to {_join_quote(values)}",
    )


CAPABILITIES_ALLOWED = frozenset(
    (
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    )
)
"""check_capabilities_baseline.go capabilities_allowed_1_0."""


def _caps(c: Obj, key: str) -> list[str]:
    caps = _sc(c).get("capabilities")
    return [str(x) for x in (caps.get(key) or [])] if isinstance(caps, Mapping) else []


def capabilities_baseline(meta: Obj, spec: Obj) -> Result | None:
    """check_capabilities_baseline.go capabilitiesBaseline_1_0."""
    bad: list[str] = []
    caps: set[str] = set()
    for c in _containers(spec):
        extra = [x for x in _caps(c, "add") if x not in CAPABILITIES_ALLOWED]
        if extra:
            bad.append(_name(c))
            caps.update(extra)
    if not bad:
        return None
    return (
        "non-default capabilities",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must not include "
        f"{_join_quote(sorted(caps))} in securityContext.capabilities.add",
    )


def host_namespaces(meta: Obj, spec: Obj) -> Result | None:
    """check_hostNamespaces.go hostNamespaces_1_0."""
    shared = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    return ("host namespaces", ", ".join(shared)) if shared else None


def host_path_volumes(meta: Obj, spec: Obj) -> Result | None:
    """check_hostPathVolumes.go hostPathVolumes_1_0."""
    bad = [str(v.get("name", "")) for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    if not bad:
        return None
    return "hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)}"


def host_ports(meta: Obj, spec: Obj) -> Result | None:
    """check_hostPorts.go hostPorts_1_0 (the ports sorted as strings: sets.String.List)."""
    bad: list[str] = []
    ports: set[str] = set()
    for c in _containers(spec):
        used = [str(p.get("hostPort")) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(_name(c))
            ports.update(used)
    if not bad:
        return None
    return (
        "hostPort",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} "
        f"{_plural('uses', 'use', len(bad))} {_plural('hostPort', 'hostPorts', len(ports))} "
        f"{', '.join(sorted(ports))}",
    )


def _hosts(handler: Any) -> list[str]:
    if not isinstance(handler, Mapping):
        return []
    return [
        str(h["host"])
        for h in (handler.get("httpGet"), handler.get("tcpSocket"))
        if isinstance(h, Mapping) and h.get("host")
    ]


def host_probes_and_lifecycle(meta: Obj, spec: Obj) -> Result | None:
    """check_hostProbesAndhostLifecycle.go hostProbesAndHostLifecycleV1Dot34 (containers and hosts are
    sets, so both sorted)."""
    bad: set[str] = set()
    hosts: set[str] = set()
    for c in _containers(spec):
        lifecycle = c.get("lifecycle") or {}
        for handler in (
            c.get("livenessProbe"),
            c.get("readinessProbe"),
            c.get("startupProbe"),
            lifecycle.get("postStart"),
            lifecycle.get("preStop"),
        ):
            found = _hosts(handler)
            if found:
                bad.add(_name(c))
                hosts.update(found)
    if not bad:
        return None
    return (
        "probe or lifecycle host",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(sorted(bad))} "
        f"{_plural('uses', 'use', len(bad))} "
        f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} "
        f"{_join_quote(sorted(hosts))}",
    )


def privileged(meta: Obj, spec: Obj) -> Result | None:
    """check_privileged.go privileged_1_0."""
    bad = [_name(c) for c in _containers(spec) if _sc(c).get("privileged") is True]
    if not bad:
        return None
    return (
        "privileged",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must not set "
        "securityContext.privileged=true",
    )


def _proc_mount(spec: Obj) -> Result | None:
    """check_procMount_baseline.go procMount_1_0."""
    bad: list[str] = []
    types: set[str] = set()
    for c in _containers(spec):
        pm = _sc(c).get("procMount")
        if pm is not None and pm != "Default":
            bad.append(_name(c))
            types.add(str(pm))
    if not bad:
        return None
    return (
        "procMount",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must not set "
        f"securityContext.procMount to {_join_quote(sorted(types))}",
    )


def proc_mount_baseline(meta: Obj, spec: Obj) -> Result | None:
    """check_procMount_baseline.go procMount1_35baseline (user namespaces relax it)."""
    return None if _user_namespace(spec) else _proc_mount(spec)


def proc_mount_restricted(meta: Obj, spec: Obj) -> Result | None:
    """check_procMount_restricted.go: procMount_1_0 with no user-namespace relaxation."""
    return _proc_mount(spec)


SELINUX_TYPES = frozenset(("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"))


def selinux_options(meta: Obj, spec: Obj) -> Result | None:
    """check_seLinuxOptions.go seLinuxOptions1_31."""
    bad_types: set[str] = set()
    flags = {"user": False, "role": False}

    def valid(opts: Obj) -> bool:
        ok = True
        if str(opts.get("type", "")) not in SELINUX_TYPES:
            ok = False
            bad_types.add(str(opts.get("type", "")))
        for k in ("user", "role"):
            if opts.get(k):
                ok = False
                flags[k] = True
        return ok

    opts = _sc(spec).get("seLinuxOptions")
    pod_bad = isinstance(opts, Mapping) and not valid(opts)
    bad: list[str] = []
    for c in _containers(spec):
        opts = _sc(c).get("seLinuxOptions")
        if isinstance(opts, Mapping) and not valid(opts):
            bad.append(_name(c))
    setters = _setters(pod_bad, bad)
    if not setters:
        return None
    data = []
    if bad_types:
        data.append(f"{_plural('type', 'types', len(bad_types))} {_join_quote(sorted(bad_types))}")
    data += [f"{k} may not be set" for k in ("user", "role") if flags[k]]
    return (
        "seLinuxOptions",
        f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}",
    )


def _seccomp_type(obj: Obj) -> str | None:
    profile = _sc(obj).get("seccompProfile")
    return str(profile.get("type", "")) if isinstance(profile, Mapping) else None


def _valid_seccomp(t: str | None) -> bool:
    return t in ("Localhost", "RuntimeDefault")


def _seccomp(spec: Obj, restricted: bool) -> Result | None:
    """check_seccompProfile_baseline.go seccompProfileBaseline_1_19 and
    check_seccompProfile_restricted.go seccompProfileRestricted_1_19 (unset is bad only there)."""
    values: set[str] = set()
    pod_type = _seccomp_type(spec)
    pod_bad = pod_type is not None and not _valid_seccomp(pod_type)
    if pod_bad:
        values.add(str(pod_type))
    explicit: list[str] = []
    implicit: list[str] = []
    for c in _containers(spec):
        t = _seccomp_type(c)
        if t is not None:
            if not _valid_seccomp(t):
                explicit.append(_name(c))
                values.add(t)
        elif not (pod_type is not None and not pod_bad):
            implicit.append(_name(c))
    setters = _setters(pod_bad, explicit)
    if setters:
        return (
            "seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to "
            f"{_join_quote(sorted(values))}",
        )
    if restricted and implicit:
        return (
            "seccompProfile",
            f"pod or {_plural('container', 'containers', len(implicit))} {_join_quote(implicit)} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
        )
    return None


def seccomp_baseline(meta: Obj, spec: Obj) -> Result | None:
    return _seccomp(spec, restricted=False)


def seccomp_restricted(meta: Obj, spec: Obj) -> Result | None:
    """seccompProfileRestricted_1_25: Windows pods are exempt."""
    return None if _windows(spec) else _seccomp(spec, restricted=True)


SAFE_SYSCTLS = frozenset(
    (
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    )
)
"""check_sysctls.go sysctlsAllowedV1Dot32."""


def sysctls(meta: Obj, spec: Obj) -> Result | None:
    """check_sysctls.go sysctlsV1Dot32 (in the pod's order, not sorted)."""
    bad = [str(s.get("name")) for s in _sc(spec).get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    return ("forbidden sysctls", ", ".join(bad)) if bad else None


def windows_host_process(meta: Obj, spec: Obj) -> Result | None:
    """check_windowsHostProcess.go windowsHostProcess_1_0."""

    def host_process(obj: Obj) -> bool:
        return (_sc(obj).get("windowsOptions") or {}).get("hostProcess") is True

    setters = _setters(host_process(spec), [_name(c) for c in _containers(spec) if host_process(c)])
    if not setters:
        return None
    return (
        "hostProcess",
        f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true",
    )


def allow_privilege_escalation(meta: Obj, spec: Obj) -> Result | None:
    """check_allowPrivilegeEscalation.go allowPrivilegeEscalation_1_25."""
    if _windows(spec):
        return None
    bad = [_name(c) for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return (
        "allowPrivilegeEscalation != false",
        f"{_plural('container', 'containers', len(bad))} {_join_quote(bad)} must set "
        "securityContext.allowPrivilegeEscalation=false",
    )


def capabilities_restricted(meta: Obj, spec: Obj) -> Result | None:
    """check_capabilities_restricted.go capabilitiesRestricted_1_25."""
    if _windows(spec):
        return None
    missing_drop: list[str] = []
    adding: list[str] = []
    caps: set[str] = set()
    for c in _containers(spec):
        if not isinstance(_sc(c).get("capabilities"), Mapping):
            missing_drop.append(_name(c))
            continue
        if "ALL" not in _caps(c, "drop"):
            missing_drop.append(_name(c))
        extra = [x for x in _caps(c, "add") if x != "NET_BIND_SERVICE"]
        if extra:
            adding.append(_name(c))
            caps.update(extra)
    details = []
    if missing_drop:
        details.append(
            f"{_plural('container', 'containers', len(missing_drop))} {_join_quote(missing_drop)} must set "
            'securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_plural('container', 'containers', len(adding))} {_join_quote(adding)} must not include "
            f"{_join_quote(sorted(caps))} in securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


ALLOWED_VOLUMES = frozenset(
    (
        *("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim"),
        *("projected", "secret"),
    )
)
RESTRICTED_VOLUMES = (
    *("hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi", "glusterfs"),
    *("rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile", "vsphereVolume", "quobyte"),
    *("azureDisk", "photonPersistentDisk", "portworxVolume", "scaleIO", "storageos"),
)
"""check_restrictedVolumes.go's switch, in its order (the JSON names are the words it prints)."""


def restricted_volumes(meta: Obj, spec: Obj) -> Result | None:
    """check_restrictedVolumes.go restrictedVolumes_1_0."""
    bad: list[str] = []
    types: set[str] = set()
    for v in spec.get("volumes") or []:
        if any(v.get(k) is not None for k in ALLOWED_VOLUMES):
            continue
        bad.append(str(v.get("name", "")))
        types.add(next((k for k in RESTRICTED_VOLUMES if v.get(k) is not None), "unknown"))
    if not bad:
        return None
    return (
        "restricted volume types",
        f"{_plural('volume', 'volumes', len(bad))} {_join_quote(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(types))} "
        f"{_join_quote(sorted(types))}",
    )


def run_as_non_root(meta: Obj, spec: Obj) -> Result | None:
    """check_runAsNonRoot.go runAsNonRoot1_35."""
    if _user_namespace(spec):
        return None
    pod_value = _sc(spec).get("runAsNonRoot")
    explicit: list[str] = []
    implicit: list[str] = []
    for c in _containers(spec):
        value = _sc(c).get("runAsNonRoot")
        if value is not None:
            if value is False:
                explicit.append(_name(c))
        elif pod_value is not True:
            implicit.append(_name(c))
    setters = _setters(pod_value is False, explicit)
    if setters:
        return (
            "runAsNonRoot != true",
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
        )
    if implicit:
        return (
            "runAsNonRoot != true",
            f"pod or {_plural('container', 'containers', len(implicit))} {_join_quote(implicit)} must set "
            "securityContext.runAsNonRoot=true",
        )
    return None


def run_as_user(meta: Obj, spec: Obj) -> Result | None:
    """check_runAsUser.go runAsUser1_35."""
    if _user_namespace(spec):
        return None
    setters = _setters(
        _sc(spec).get("runAsUser") == 0, [_name(c) for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    )
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


BASELINE: tuple[Check, ...] = (
    # policy/registry.go populate: the baseline IDs sorted (appArmorProfile, capabilities_baseline,
    # hostNamespaces, hostPathVolumes, hostPorts, hostProbesAndHostLifecycle, privileged, procMount,
    # seLinuxOptions, seccompProfile_baseline, sysctls, windowsHostProcess).
    app_armor_profile,
    capabilities_baseline,
    host_namespaces,
    host_path_volumes,
    host_ports,
    host_probes_and_lifecycle,
    privileged,
    proc_mount_baseline,
    selinux_options,
    seccomp_baseline,
    sysctls,
    windows_host_process,
)
RESTRICTED: tuple[Check, ...] = (
    # The baseline checks no restricted check overrides, in their order, then the restricted IDs sorted
    # (allowPrivilegeEscalation, capabilities_restricted, procMount_restricted, restrictedVolumes,
    # runAsNonRoot, runAsUser, seccompProfile_restricted); overridden: capabilities_baseline,
    # hostPathVolumes, procMount, seccompProfile_baseline.
    app_armor_profile,
    host_namespaces,
    host_ports,
    host_probes_and_lifecycle,
    privileged,
    selinux_options,
    sysctls,
    windows_host_process,
    allow_privilege_escalation,
    capabilities_restricted,
    proc_mount_restricted,
    restricted_volumes,
    run_as_non_root,
    run_as_user,
    seccomp_restricted,
)


def evaluate(level: str, meta: Obj, spec: Obj) -> list[Result]:
    """checkRegistry.EvaluatePod: the failed checks of ``level`` for a pod's metadata and spec."""
    checks = {"baseline": BASELINE, "restricted": RESTRICTED}.get(level, ())
    return [r for check in checks if (r := check(meta, spec)) is not None]


def violation(results: Sequence[Result]) -> str:
    """AggregateCheckResult.ForbiddenDetail: ``reason (detail), reason (detail)``."""
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in results)


def modelled(lv: LevelVersion) -> LevelVersion:
    """``lv`` when its checks are the ones modelled here: privileged (no check at any version), or a
    version from v1.35 on (``latest`` included); else an ``ApiError`` 500 (``errors.internal``): a verdict
    the emulator would give wrongly, which a test then sees instead."""
    m = VERSION.match(lv.version)
    if lv.level != "privileged" and m is not None and int(m.group(1)) < NEWEST_MINOR:
        raise internal(f"not modelled: PodSecurity version {lv.version} (only v1.{NEWEST_MINOR}+ and latest)")
    return lv


def refusal(labels: Mapping[str, str] | None, meta: Obj, spec: Obj) -> str | None:
    """The message after ``pods "x" is forbidden: `` when the namespace's enforce level refuses the pod."""
    lv = modelled(policy(labels).enforce)
    failed = evaluate(lv.level, meta, spec)
    return f'violates PodSecurity "{lv}": {violation(failed)}' if failed else None


def warning(labels: Mapping[str, str] | None, meta: Obj, spec: Obj) -> str | None:
    """The warning an admitted pod or a workload's template gets when the warn level fails."""
    lv = modelled(policy(labels).warn)
    failed = evaluate(lv.level, meta, spec)
    return f'would violate PodSecurity "{lv}": {violation(failed)}' if failed else None


def significant_update(new: Obj, old: Obj) -> bool:
    """admission.go isSignificantPodUpdate: the number of (init) containers or an image changed, or an
    ephemeral container was added or changed its image."""
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    for key in ("containers", "initContainers"):
        a, b = ns.get(key) or [], os_.get(key) or []
        if len(a) != len(b) or any(x.get("image") != y.get("image") for x, y in zip(a, b, strict=True)):
            return True
    before = {c.get("name"): c.get("image") for c in os_.get("ephemeralContainers") or []}
    return any(
        c.get("name") not in before or before[c.get("name")] != c.get("image")
        for c in ns.get("ephemeralContainers") or []
    )


def _go_quote(s: str) -> str:
    """Go's %q for the printable ASCII an annotation value usually is."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
