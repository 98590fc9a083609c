#!/usr/bin/env bash
# Idempotent set-up of the OpenStack lab (a real Neutron on a private MariaDB) on a fresh Debian 12 machine,
# run as root: Debian's MariaDB server and client cores, and a SEPARATE virtualenv .venv-neutron with
# neutron==29.0.0 and its server dependencies, pinned in lab/openstack/requirements-neutron.txt, so that
# Neutron's ~130 packages never touch the project's .venv. A stamp skips the install when nothing changed.
#
# Usage: scripts/setup_openstack.sh [--help | --print-packages]
#   --print-packages  the Debian packages it installs, one per line (for the install-drift test)
# Exit codes: 0 ok, 1 an install step failed, 2 bad usage.
#
# MariaDB: mariadb-server-core (mariadbd, mariadb-install-db) and mariadb-client-core (my_print_defaults,
# which mariadb-install-db runs) are all the lab uses. Not mariadb-server: it adds 13 packages (galera-4,
# perl, rsync, socat, lsof, ...) and an init script whose postinst starts a system-wide mariadbd; the lab
# starts its own mariadbd per test session (lab/openstack/neutron.py) and needs no service, no systemd.
# Environment: PYTHON (default python3) makes the virtualenv.
set -euo pipefail

APT_PACKAGES=(mariadb-server-core mariadb-client-core)

case "${1:-}" in
  -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --print-packages) printf '%s\n' "${APT_PACKAGES[@]}"; exit 0 ;;
  "") ;;
  *) echo "setup_openstack: unknown argument ${1@Q} (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

fail() { echo "setup_openstack.failed step=$1 reason='$2'" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail root "must run as root (it installs Debian packages)"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
PY="${PYTHON:-python3}"
# Debian's own python3 has no ensurepip without python3-venv (a pyenv or upstream build has it built in).
if ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup_openstack.installing packages='${missing[*]}'"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail apt-update "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || fail apt-install "${missing[*]}"
fi
for tool in /usr/sbin/mariadbd /usr/bin/mariadb-install-db /usr/bin/my_print_defaults; do
  [ -x "$tool" ] || fail check "$tool is missing after the install"
done

REQ=lab/openstack/requirements-neutron.txt
VENV=.venv-neutron
[ -f "$REQ" ] || fail requirements "$REQ not found"
key=$( { cat "$REQ"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
stamp="$VENV/.installed-$key"
if [ ! -f "$stamp" ]; then
  echo "setup_openstack.venv path=$VENV requirements=$REQ"
  if [ -d "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    rm -rf "$VENV"  # a broken or foreign venv (e.g. another interpreter): start over
  fi
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" || fail venv "$PY -m venv $VENV"
  start=$(date +%s)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" || fail pip "pip install -r $REQ"
  "$VENV/bin/python" -m pip check >/dev/null || fail pip-check "$("$VENV/bin/python" -m pip check | head -3)"
  "$VENV/bin/python" -W ignore -c 'import neutron, neutron_lib, pymysql, pyuwsgi' || fail import "neutron, pymysql or pyuwsgi"
  rm -f "$VENV"/.installed-* && touch "$stamp"
  echo "setup_openstack.venv_installed seconds=$(( $(date +%s) - start )) size='$(du -sh "$VENV" | cut -f1)'"
fi
for tool in uwsgi neutron-db-manage; do
  [ -x "$VENV/bin/$tool" ] || fail check "$VENV/bin/$tool is missing"
done

# The lab's daemons are per test session; a system-wide MariaDB (from elsewhere) is not ours to stop.
if pgrep -x mariadbd >/dev/null 2>&1 && [ -e /run/mysqld/mysqld.pid ]; then
  echo "setup_openstack.warning reason='a system mariadbd is running (not started by this script; the lab does not use it)'"
fi
echo "setup_openstack.ok mariadb='$(/usr/sbin/mariadbd --version | awk '{print $3}')' neutron='$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("neutron"))')' venv=$VENV"
