"""A REAL Neutron API server (PyPI neutron 29.0.0) on a private MariaDB, started and stopped by tests.

What runs (all on 127.0.0.1, free ports, one run directory ``<tmp>/vpngw-os-<pid>-neutron_*``)::

    mariadbd --defaults-file=<run>/my.cnf      own datadir, TCP only, no systemd, started as root (user=root)
    uwsgi --ini <run>/uwsgi.ini                pyuwsgi from .venv-neutron: neutron.wsgi.api:application,
                                               master + 1 worker, 4 threads, ``Connection: close`` header

Neutron's configuration is the minimal one of LAB-FACTS.md: ``auth_strategy = noauth`` (every request is
admin in project ``fake_project_id`` unless it sends X-Project-Id), ml2 with the flat and vxlan type
drivers and NO mechanism drivers (no agents: ports stay DOWN, a bound host gives ``binding_failed``),
``port_security``, the ``router`` service plugin (extraroute, extraroute-atomic), ``transport_url =
fake://`` (no message queue). Quotas are unlimited by default (tests can set quotas through the API).

Speed: ``neutron-db-manage upgrade heads`` costs ~4 s, so a migrated, cleanly shut down datadir is kept as
a template in ``.venv-neutron/.lab-cache/`` keyed by the pinned requirements, the MariaDB version and the
schema-relevant configuration; every start copies it (~30 ms). ``VPNGW_NEUTRON_CACHE=0`` migrates fresh.
``stop()``/``start()`` stop and restart the Neutron API process alone (same port, database kept): the
"Neutron is down" fault. ``close()`` stops everything and removes the run directory; it also runs from
``atexit``; a SIGKILLed owner's leftovers are removed by ``process.cleanup_stale`` at the next start.

Ports: mariadbd and uWSGI must be told their port, so each first start picks a free one and is retried on
a new one when the daemon exits saying "Address already in use" (another process took the port between
the pick and the bind; ``lab.ports.start_on_free_port``). A restart keeps its port (clients know it): a
port taken while the daemon was down is retried for a few seconds, then the start fails saying so.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from lab import ports
from lab.openstack import process
from lab.openstack.process import LabOpenStackError
from lab.openstack.rest import call, http_status
from lab.wait import WaitTimeout, wait_for

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-neutron"
REQUIREMENTS = Path(__file__).with_name("requirements-neutron.txt")
MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "/usr/bin/mariadb-install-db"
CACHE_FORMAT = "3"
"""Bump when the template's layout or content changes: old templates are then ignored (and removed)."""

DB_NAME = "neutron"
DB_USER = "neutron"
DB_PASSWORD = "neutron-lab"  # noqa: S105 - test-only credential of a database bound to 127.0.0.1
ADMIN_PROJECT = "fake_project_id"
"""noauth: requests without X-Project-Id act as admin in this project (neutron.auth.NoauthFakeProjectId)."""

MY_CNF = """\
[client-server]
# relative: mariadbd runs in its datadir, and a unix socket path is limited to 107 bytes (a deep TMPDIR
# made mariadbd abort: "The socket file path is too long")
socket = mysqld.sock
[mariadbd]
user = root
datadir = {datadir}
pid-file = {dir}/mysqld.pid
log-error = {dir}/mysqld.err
bind-address = 127.0.0.1
port = {port}
skip-name-resolve
skip-log-bin
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
# A throwaway test database: durability is not wanted, speed is (each is a documented MariaDB option).
innodb_buffer_pool_size = 64M
innodb_log_file_size = 8M
innodb_flush_log_at_trx_commit = 0
innodb_doublewrite = 0
innodb_flush_method = nosync
# Undo logs in their own files, truncated when purged: the migrations' undo does not stay in ibdata1
# (which grew to 80 MB otherwise) and every start copies a smaller template.
innodb_undo_tablespaces = 2
innodb_undo_log_truncate = ON
max_connections = 200
"""

INIT_SQL = f"""\
CREATE DATABASE IF NOT EXISTS {DB_NAME} CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';
GRANT ALL PRIVILEGES ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';
"""

NEUTRON_CONF = """\
[DEFAULT]
core_plugin = ml2
service_plugins = router
auth_strategy = noauth
api_paste_config = {dir}/api-paste.ini
transport_url = fake://
dhcp_agent_notification = false
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
state_path = {dir}/state
log_file = {dir}/neutron.log
debug = {debug}
use_stderr = false
[oslo_concurrency]
lock_path = {dir}/lock
[database]
connection = mysql+pymysql://{user}:{password}@127.0.0.1:{db_port}/{db}?charset=utf8mb4
[quotas]
{quotas}
"""

ML2_CONF = """\
[ml2]
type_drivers = flat,vxlan
project_network_types = vxlan
mechanism_drivers =
extension_drivers = port_security
[ml2_type_flat]
flat_networks = {physnet}
[ml2_type_vxlan]
vni_ranges = 1:1000
"""

UWSGI_INI = """\
[uwsgi]
http-socket = 127.0.0.1:{port}
module = neutron.wsgi.api:application
pyargv = --config-file {dir}/neutron.conf --config-file {dir}/ml2_conf.ini
master = true
processes = {processes}
threads = {threads}
lazy-apps = true
die-on-term = true
no-orphans = true
need-app = true
# uWSGI's http-socket closes the connection after each answer; without saying so, a client that reuses
# the connection (openstacksdk does) fails with ConnectionResetError (LAB-FACTS.md).
add-header = Connection: close
buffer-size = 65535
disable-logging = true
"""

QUOTA_RESOURCES = (
    "network",
    "subnet",
    "port",
    "router",
    "floatingip",
    "security_group",
    "security_group_rule",
    "rbac_policy",
    "subnetpool",
)

WARM_UP_PATHS = (
    "/v2.0/networks", "/v2.0/subnets", "/v2.0/ports", "/v2.0/routers", "/v2.0/floatingips",
    "/v2.0/security-groups", "/v2.0/security-group-rules", "/v2.0/quotas",
)  # fmt: skip

PHYSNET = "public"
"""The flat physical network the external network is created on (``provider:physical_network``)."""


@dataclass(frozen=True)
class NeutronSettings:
    """How the lab's Neutron is started. Every field has a default that works on a set-up machine."""

    venv: Path = DEFAULT_VENV
    """The separate virtualenv scripts/setup_openstack.sh creates (neutron, pyuwsgi, PyMySQL)."""
    processes: int = 1
    """uWSGI worker processes (each ~170-230 MB RSS)."""
    threads: int = 4
    """Threads per worker: concurrent requests Neutron serves at once."""
    unlimited_quotas: bool = True
    """Neutron's defaults (e.g. 10 security groups per project) would cap a session-long test cloud; tests
    that want quota errors set a quota through the API (``conn.network.update_quota``)."""
    debug: bool = False
    """Neutron's ``debug`` (its log under the run directory gets every request)."""
    use_cache: bool = field(default_factory=lambda: os.environ.get("VPNGW_NEUTRON_CACHE", "1") != "0")
    """Copy a cached migrated datadir instead of running the migrations (``VPNGW_NEUTRON_CACHE=0``: off)."""
    start_timeout: float = 90.0
    """Seconds each daemon may take to answer before the start fails."""
    tmp_root: Path | None = None
    """Where the run directory goes (default: ``tempfile.gettempdir()``)."""


def _check_installed(settings: NeutronSettings) -> None:
    missing = [p for p in (MARIADBD, INSTALL_DB, "/usr/bin/my_print_defaults") if not os.path.exists(p)]
    for tool in ("uwsgi", "neutron-db-manage"):
        if not (settings.venv / "bin" / tool).exists():
            missing.append(str(settings.venv / "bin" / tool))
    if missing:
        raise LabOpenStackError(f"missing {', '.join(missing)}: run scripts/setup_openstack.sh (as root)")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def mysql_greets(port: int, timeout: float = 1.0) -> bool:
    """True when a MySQL protocol greeting (protocol version 10) arrives on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            head = s.recv(5)
            return len(head) == 5 and head[4] == 10
    except OSError:
        return False


SAME_PORT_TRIES = 20
SAME_PORT_PAUSE = 0.25
"""A restart on its old port that finds it taken tries again this often, this far apart (~5 s): another
process's momentary probe (a bind to pick a free port) goes away; a listener that stays is an error."""


def _start_on_port(port: int, start: Callable[[int], None], what: str) -> None:
    """``start(port)``: on a free port picked now when ``port`` is 0 (retried on a new one when taken),
    else on ``port`` itself (a restart), retried a few times when taken; LabOpenStackError at the end."""
    if port == 0:
        try:
            ports.start_on_free_port(start, what=what)
        except ports.PortsExhausted as exc:
            raise LabOpenStackError(str(exc)) from exc
        return
    for _ in range(SAME_PORT_TRIES):
        try:
            start(port)
            return
        except ports.PortTaken as exc:
            last = exc
            log.info("lab.openstack.port_taken what=%s port=%d", what, port)
            time.sleep(SAME_PORT_PAUSE)  # a back-off between attempts to bind, not a wait before a check
    raise LabOpenStackError(
        f"{what}: its port {port} was taken by another process while it was down (restart tried "
        f"{SAME_PORT_TRIES} times): {last}"
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    """What a daemon wrote to ``path`` (a log it appends to) since it was ``offset`` bytes long."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if ports.address_in_use(line)]
    return (lines or text.strip().splitlines() or [""])[-1].strip()


@dataclass
class MariaDB:
    """A private mariadbd on 127.0.0.1:``port`` with its datadir under ``dir``."""

    dir: Path
    run_dir: Path
    port: int = 0
    """0 until the first ``start`` picks a free port (then kept: Neutron's configuration names it)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def datadir(self) -> Path:
        return self.dir / "data"

    @property
    def cnf(self) -> Path:
        return self.dir / "my.cnf"

    @property
    def url(self) -> str:
        return f"mysql+pymysql://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{self.port}/{DB_NAME}?charset=utf8mb4"

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cnf.write_text(MY_CNF.format(dir=self.dir, datadir=self.datadir, port=self.port))

    def install(self) -> None:
        """``mariadb-install-db`` into an empty datadir."""
        self.write_config()
        res = subprocess.run(
            [
                INSTALL_DB,
                f"--defaults-file={self.cnf}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if res.returncode != 0:
            raise LabOpenStackError(
                f"mariadb-install-db failed ({res.returncode}): {res.stdout.decode(errors='replace')[-800:]}"
            )

    def start(self, *, init_sql: str | None = None, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise LabOpenStackError(f"mariadbd already running (pid {self.proc.pid})")
        _start_on_port(self.port, lambda port: self._start_on(port, init_sql, timeout), "mariadbd")

    def _start_on(self, port: int, init_sql: str | None, timeout: float) -> None:
        self.port = port
        self.write_config()
        argv = [MARIADBD, f"--defaults-file={self.cnf}"]
        if init_sql is not None:
            init = self.dir / "init.sql"
            init.write_text(init_sql)
            argv.append(f"--init-file={init}")
        err_log = self.dir / "mysqld.err"
        since = _size(err_log)
        self.proc = process.spawn(argv, run_dir=self.run_dir, log_path=self.dir / "mysqld.out")
        proc = self.proc

        def greets() -> bool:
            # The child exiting fails the start at once (raised here, not "not yet").
            if proc.poll() is not None:
                said = _read_from(err_log, since)
                if ports.address_in_use(said):
                    process.stop_group(proc, grace=10.0, what="mariadbd")
                    raise ports.PortTaken(f"mariadbd on port {port}: {_last_line(said)}")
                raise LabOpenStackError(f"mariadbd exited with {proc.returncode}:\n{_tail(err_log)}")
            return mysql_greets(port)

        try:
            wait_for(greets, timeout, f"mariadbd to answer on port {port}", interval=0.01)
        except WaitTimeout as exc:
            msg = f"mariadbd did not answer on port {self.port} in {timeout:.0f} s"
            raise LabOpenStackError(msg) from exc
        log.debug("lab.openstack.mariadb.started port=%d pid=%d", self.port, proc.pid)

    def stop(self) -> None:
        process.stop_group(self.proc, grace=30.0, what="mariadbd")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _cache_key(settings: NeutronSettings) -> str:
    version = subprocess.run([MARIADBD, "--version"], capture_output=True, check=False, timeout=30).stdout
    h = hashlib.sha256()
    parts = (CACHE_FORMAT.encode(), REQUIREMENTS.read_bytes(), version, MY_CNF.encode(), INIT_SQL.encode())
    for part in (*parts, ML2_CONF.encode(), b"service_plugins=router"):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _migrate(settings: NeutronSettings, db: MariaDB, conf_dir: Path) -> None:
    """``neutron-db-manage upgrade heads`` against ``db`` (configs written into ``conf_dir``)."""
    _write_neutron_config(conf_dir, settings, db_port=db.port)
    t0 = time.monotonic()
    res = subprocess.run(
        [
            str(settings.venv / "bin" / "neutron-db-manage"),
            "--config-file",
            str(conf_dir / "neutron.conf"),
            "--config-file",
            str(conf_dir / "ml2_conf.ini"),
            "upgrade",
            "heads",
        ],
        capture_output=True,
        timeout=600,
        check=False,
    )
    (conf_dir / "migrate.log").write_bytes(res.stdout + res.stderr)
    if res.returncode != 0:
        raise LabOpenStackError(f"neutron-db-manage upgrade heads failed:\n{_tail(conf_dir / 'migrate.log')}")
    log.info("lab.openstack.neutron.migrated seconds=%.2f", time.monotonic() - t0)


def _build_database(settings: NeutronSettings, db: MariaDB, conf_dir: Path) -> None:
    """A fresh datadir with the database, its user and Neutron's schema; ``db`` is left running."""
    db.install()
    db.start(init_sql=INIT_SQL, timeout=settings.start_timeout)
    _migrate(settings, db, conf_dir)


@dataclass(frozen=True)
class Seed:
    """Resources to create in a fresh Neutron and keep in the cached template (e.g. the test cloud).

    ``build`` creates them and returns JSON-able data describing them (ids, names); a later start from
    the cache gets the same data back as ``Neutron.seed_data`` without running ``build``. ``key`` must
    change whenever what ``build`` creates changes (include a hash of the code that builds it)."""

    key: str
    build: Callable[[Neutron], dict[str, Any]]


def _cache_dir(settings: NeutronSettings) -> Path:
    cache = settings.venv / ".lab-cache"
    cache.mkdir(exist_ok=True)
    return cache


def _template(settings: NeutronSettings, seed: Seed | None = None) -> Path:
    """The cached datadir (migrated, and seeded when ``seed`` is given), built under a lock when missing."""
    cache = _cache_dir(settings)
    key = _cache_key(settings)
    base = cache / f"neutron-db-{key}"
    target = base if seed is None else cache / f"neutron-db-{key}-{_safe(seed.key)}"
    if (target / "READY").exists():
        return target
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "READY").exists():
            return target
        for old in [*cache.glob("neutron-db-*"), *cache.glob("build-*")]:
            if not old.name.startswith(base.name):
                shutil.rmtree(old, ignore_errors=True)  # other keys: a reinstall or a config change
        if not (base / "READY").exists():
            _build_template(settings, base, cache)
        if seed is not None:
            _build_seeded(settings, base, target, cache, seed)
        return target


def _build_template(settings: NeutronSettings, target: Path, cache: Path) -> None:
    run_dir = process.make_run_dir("neutron_template", settings.tmp_root)
    db = MariaDB(dir=run_dir / "mysql", run_dir=run_dir)
    try:
        _build_database(settings, db, run_dir / "neutron")
        db.stop()  # a clean shutdown: the copied datadir needs no crash recovery
        _store(db.datadir, target, cache, None)
    finally:
        db.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    log.info("lab.openstack.neutron.template_built dir=%s", target.name)


def _build_seeded(settings: NeutronSettings, base: Path, target: Path, cache: Path, seed: Seed) -> None:
    t0 = time.monotonic()
    neutron = _launch(settings, base)
    try:
        data = seed.build(neutron)
        neutron.stop()
        neutron.db.stop()
        _store(neutron.db.datadir, target, cache, data)
    finally:
        neutron.close()
    log.info("lab.openstack.neutron.seed_built dir=%s seconds=%.2f", target.name, time.monotonic() - t0)


def _store(datadir: Path, target: Path, cache: Path, data: dict[str, Any] | None) -> None:
    build = cache / f"build-{secrets.token_hex(4)}"
    shutil.copytree(datadir, build / "data", symlinks=True)
    if data is not None:
        (build / "seed.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    (build / "READY").write_text(f"{time.time()}\n")
    os.rename(build, target)


def _safe(key: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", key)[:80]


def _write_neutron_config(conf_dir: Path, settings: NeutronSettings, *, db_port: int) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "lock"):
        (conf_dir / sub).mkdir(exist_ok=True)
    shutil.copyfile(settings.venv / "etc" / "neutron" / "api-paste.ini", conf_dir / "api-paste.ini")
    quotas = "\n".join(f"quota_{r} = -1" for r in QUOTA_RESOURCES) if settings.unlimited_quotas else ""
    (conf_dir / "neutron.conf").write_text(
        NEUTRON_CONF.format(
            dir=conf_dir,
            debug=str(settings.debug).lower(),
            user=DB_USER,
            password=DB_PASSWORD,
            db_port=db_port,
            db=DB_NAME,
            quotas=quotas,
        )
    )
    (conf_dir / "ml2_conf.ini").write_text(ML2_CONF.format(physnet=PHYSNET))


def _write_uwsgi_ini(conf_dir: Path, settings: NeutronSettings, port: int) -> None:
    (conf_dir / "uwsgi.ini").write_text(
        UWSGI_INI.format(port=port, dir=conf_dir, processes=settings.processes, threads=settings.threads)
    )


_open: set[Neutron] = set()


@atexit.register
def _close_all() -> None:  # pragma: no cover - last-resort teardown
    for n in list(_open):
        n.close()


@dataclass(eq=False)
class Neutron:
    """A running lab Neutron: its endpoint, an openstacksdk connection factory, stop/start of the API.

    Create with ``start_neutron()`` (or use as a context manager); ``close()`` on every exit path."""

    settings: NeutronSettings
    run_dir: Path
    db: MariaDB
    port: int = 0
    """0 until the first ``start`` picks a free port (then kept: a restart comes back on it)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent per start phase (``database``, ``api``, ``total``), for the bench and the docs."""
    starts: int = 0
    seed_data: dict[str, Any] | None = None
    """What the ``Seed`` given to ``start_neutron`` described (None without a seed)."""
    _closed: bool = False

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: Neutron's root (version discovery); the API is under ``/v2.0``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def conf_dir(self) -> Path:
        return self.run_dir / "neutron"

    @property
    def log_path(self) -> Path:
        return self.conf_dir / "neutron.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """Live processes of this lab (mariadbd, uWSGI master and workers)."""
        groups = [p.pid for p in (self.db.proc, self.proc) if p is not None]
        return [pid for g in groups for pid in process.group_members(g)]

    def connect(self, endpoint: str | None = None, **kwargs: Any) -> Any:
        """A ready openstacksdk Connection to this Neutron (or to ``endpoint``, e.g. a fault proxy in
        front of it). ``kwargs`` go to ``lab.openstack.sdk.connect`` (compute=, timeout=, retries...)."""
        from lab.openstack.sdk import connect

        return connect(endpoint or self.endpoint, **kwargs)

    def start(self) -> None:
        """Start the Neutron API process (the database must be running) and wait until it answers."""
        if self._closed:
            raise LabOpenStackError("this Neutron was closed")
        if self.running:
            raise LabOpenStackError(f"Neutron already running (pid {self.proc.pid if self.proc else '?'})")
        t0 = time.monotonic()
        _start_on_port(self.port, self._start_on, "Neutron (uWSGI)")
        self.starts += 1
        self.timings["api"] = time.monotonic() - t0
        log.info("lab.openstack.neutron.started port=%d seconds=%.2f", self.port, self.timings["api"])

    def _start_on(self, port: int) -> None:
        self.port = port
        _write_uwsgi_ini(self.conf_dir, self.settings, port)
        uwsgi_log = self.conf_dir / "uwsgi.log"
        since = _size(uwsgi_log)
        self.proc = process.spawn(
            [str(self.settings.venv / "bin" / "uwsgi"), "--ini", str(self.conf_dir / "uwsgi.ini")],
            run_dir=self.run_dir,
            log_path=uwsgi_log,
            env={**_clean_env(), "HOME": str(self.conf_dir)},
        )
        proc = self.proc

        def answers() -> bool:
            # The child exiting fails the start at once (raised here, not "not yet").
            if proc.poll() is not None:
                said = _read_from(uwsgi_log, since)
                if ports.address_in_use(said):
                    process.stop_group(proc, grace=10.0, what="neutron", sig=signal.SIGKILL)
                    self.proc = None
                    raise ports.PortTaken(f"uWSGI on port {port}: {_last_line(said)}")
                logs = f"{_tail(uwsgi_log)}\n{_tail(self.log_path)}"
                raise LabOpenStackError(f"Neutron (uWSGI) exited with {proc.returncode}:\n{logs}")
            # /v2.0/extensions answers only once the plugins and extensions are loaded
            return http_status(self.endpoint, "/v2.0/extensions") == 200

        try:
            wait_for(answers, self.settings.start_timeout, f"Neutron to answer on port {port}", interval=0.05)
        except WaitTimeout as exc:
            msg = f"Neutron did not answer on port {self.port}:\n{_tail(self.log_path)}"
            raise LabOpenStackError(msg) from exc
        self._warm_up()

    def _warm_up(self) -> None:
        """One request per collection, one at a time, before anyone else asks.

        Measured: a cold Neutron answered the first CONCURRENT requests (8 at once, 4 threads) with 403
        ``PolicyNotAuthorized`` for ``GET /v2.0/quotas`` while a serial first request gets 200 (lazy policy
        initialisation racing). A controller's workers right after a Neutron restart would see the same."""
        for path in WARM_UP_PATHS:
            http_status(self.endpoint, path, timeout=30)

    def stop(self, *, graceful: bool = False) -> None:
        """Stop the Neutron API process alone (uWSGI master and workers); the database keeps running.

        Default: SIGKILL to the whole group, as a crash (in-flight requests are cut; their transactions
        roll back in MariaDB). ``graceful``: SIGINT, which uWSGI's master answers by killing its workers
        and waiting for them, ~1 s ("worker 1 buried after 1 seconds")."""
        sig = signal.SIGINT if graceful else signal.SIGKILL
        process.stop_group(self.proc, grace=10.0, what="neutron", sig=sig)
        self.proc = None
        log.info("lab.openstack.neutron.stopped port=%d", self.port)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop Neutron and MariaDB and remove the run directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            process.stop_group(self.proc, grace=10.0, what="neutron", sig=signal.SIGKILL)
        finally:
            try:
                self.db.stop()
            finally:
                self._keep_logs()
                shutil.rmtree(self.run_dir, ignore_errors=True)
                _open.discard(self)
        log.info("lab.openstack.neutron.closed port=%d", self.port)

    def _keep_logs(self) -> None:
        """With ``VPNGW_OPENSTACK_LOGS=<dir>``, Neutron's, uWSGI's and MariaDB's logs survive ``close()``
        (as ``<dir>/<run dir name>/``): the run directory itself is always removed."""
        target = os.environ.get("VPNGW_OPENSTACK_LOGS")
        if not target:
            return
        dest = Path(target) / self.run_dir.name
        dest.mkdir(parents=True, exist_ok=True)
        for src in (self.log_path, self.conf_dir / "uwsgi.log", self.db.dir / "mysqld.err"):
            with contextlib.suppress(OSError):
                shutil.copyfile(src, dest / src.name)

    def __enter__(self) -> Neutron:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def api(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """One raw JSON call to Neutron (no SDK), raising RestError on an error status: for fixtures and
        checks that must see exact answers."""
        return call(self.endpoint, method, path, body, headers=headers)


def _clean_env() -> dict[str, str]:
    """The environment for Neutron's processes: ours minus OS_* (clouds) and virtualenv variables."""
    drop = ("OS_", "VIRTUAL_ENV", "PYTHON")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _launch(settings: NeutronSettings, template: Path | None) -> Neutron:
    t0 = time.monotonic()
    run_dir = process.make_run_dir("neutron", settings.tmp_root)
    db = MariaDB(dir=run_dir / "mysql", run_dir=run_dir)
    neutron = Neutron(settings=settings, run_dir=run_dir, db=db)
    _open.add(neutron)
    try:
        if template is not None:
            db.write_config()
            shutil.copytree(template / "data", db.datadir, symlinks=True)
            db.start(timeout=settings.start_timeout)
        else:
            _build_database(settings, db, neutron.conf_dir)
        neutron.timings["database"] = time.monotonic() - t0
        _write_neutron_config(neutron.conf_dir, settings, db_port=db.port)
        neutron.start()
        neutron.timings["total"] = time.monotonic() - t0
    except BaseException:
        neutron.close()
        raise
    return neutron


def start_neutron(settings: NeutronSettings | None = None, *, seed: Seed | None = None) -> Neutron:
    """Start MariaDB and Neutron; returns the running handle (the caller must ``close()`` it).

    With ``seed``, the resources it describes exist when this returns (from the cache, or built now),
    and ``Neutron.seed_data`` holds what its ``build`` returned."""
    settings = settings or NeutronSettings()
    _check_installed(settings)
    process.cleanup_stale(settings.tmp_root)
    t0 = time.monotonic()
    if not settings.use_cache:
        neutron = _launch(settings, None)
        if seed is not None:
            try:
                neutron.seed_data = seed.build(neutron)
            except BaseException:
                neutron.close()
                raise
        neutron.timings["total"] = time.monotonic() - t0
        return neutron
    template = _template(settings, seed)
    neutron = _launch(settings, template)
    if seed is not None:
        neutron.seed_data = json.loads((template / "seed.json").read_text())
    neutron.timings["total"] = time.monotonic() - t0
    return neutron


@contextlib.contextmanager
def running_neutron(settings: NeutronSettings | None = None) -> Any:
    """``with running_neutron() as n:`` ... everything stopped and removed on exit."""
    n = start_neutron(settings)
    try:
        yield n
    finally:
        n.close()
