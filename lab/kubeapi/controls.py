"""Emulator controls as data: the request log and fault injection rules (pure)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class RequestRecord:
    """One request as the emulator saw it."""

    seq: int
    time: float
    """Wall-clock seconds (time.time())."""
    user: str
    verb: str
    """Kubernetes verb (get/list/watch/create/update/patch/delete/deletecollection) or the lowercased HTTP
    method for non-resource paths."""
    method: str
    path: str
    """Path with the query string."""
    code: int
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    content_type: str = ""
    user_agent: str = ""
    duration: float = 0.0
    """Seconds the emulator spent on it (for a watch: until the stream ended)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_matches(
    r: RequestRecord,
    *,
    verb: str | Iterable[str] | None = None,
    resource: str | None = None,
    subresource: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    user: str | None = None,
    since: int | None = None,
    writes_only: bool = False,
    path_contains: str | None = None,
) -> bool:
    if verb is not None:
        verbs = {verb} if isinstance(verb, str) else set(verb)
        if r.verb not in verbs:
            return False
    if writes_only and r.verb not in WRITE_VERBS:
        return False
    if resource is not None and r.resource != resource:
        return False
    if subresource is not None and r.subresource != subresource:
        return False
    if name is not None and r.name != name:
        return False
    if namespace is not None and r.namespace != namespace:
        return False
    if user is not None and r.user != user:
        return False
    if since is not None and r.seq <= since:
        return False
    return path_contains is None or path_contains in r.path


@dataclass
class RequestLog:
    size: int = 100000
    records: deque[RequestRecord] = field(default_factory=deque)
    seq: int = 0

    def add(self, **kw: Any) -> RequestRecord:
        self.seq += 1
        rec = RequestRecord(seq=self.seq, **kw)
        self.records.append(rec)
        while len(self.records) > self.size:
            self.records.popleft()
        return rec

    def reset(self) -> int:
        """Clear the log; returns the sequence number to use as ``since`` for later windows."""
        self.records.clear()
        return self.seq

    def query(self, **filters: Any) -> list[RequestRecord]:
        return [r for r in self.records if record_matches(r, **filters)]


@dataclass
class Fault:
    """The next ``count`` requests matching verb/resource/name/subresource/namespace answer ``code`` (with a
    Kubernetes Status body; 429/503 carry Retry-After), or first wait ``hang`` seconds (then answer ``code``,
    or proceed normally when ``code`` is 0). ``count`` -1 = every matching request until cleared."""

    code: int = 0
    count: int = 1
    verb: str | None = None
    resource: str | None = None
    name: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    user: str | None = None
    retry_after: int | None = None
    hang: float = 0.0
    message: str = ""
    id: int = 0
    hits: int = 0

    def matches(self, attrs: Mapping[str, str]) -> bool:
        for k in ("verb", "resource", "name", "subresource", "namespace", "user"):
            want = getattr(self, k)
            if want is not None and attrs.get(k, "") != want:
                return False
        return self.count != 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fault:
        allowed = {
            "code",
            "count",
            "verb",
            "resource",
            "name",
            "subresource",
            "namespace",
            "user",
            "retry_after",
            "hang",
            "message",
        }
        unknown = set(d) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        f = cls(**{k: v for k, v in d.items() if k in allowed})
        if not f.code and not f.hang:
            raise ValueError("a fault needs a code or a hang")
        return f


@dataclass
class Faults:
    rules: list[Fault] = field(default_factory=list)
    next_id: int = 1

    def add(self, fault: Fault) -> Fault:
        fault.id = self.next_id
        self.next_id += 1
        self.rules.append(fault)
        return fault

    def take(self, attrs: Mapping[str, str]) -> Fault | None:
        """The first matching rule, consumed once."""
        for f in self.rules:
            if f.matches(attrs):
                f.hits += 1
                if f.count > 0:
                    f.count -= 1
                if f.count == 0:
                    self.rules.remove(f)
                return f
        return None

    def clear(self) -> None:
        self.rules.clear()
