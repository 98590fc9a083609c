#!/usr/bin/env bash
# The containers configuration every build and run of the project's images uses (buildah, podman, skopeo,
# the tests): out/containers/containers.conf and out/containers/storage.conf, passed through
# CONTAINERS_CONF and CONTAINERS_STORAGE_CONF. Nothing under /etc is changed.
#
#   images/containers.sh write   write both files (only when their content differs); prints nothing
#   images/containers.sh env     print the `export ...` lines for a shell:  eval "$(images/containers.sh env)"
#
# Why each setting (measured on Debian 12, docs/images.md, LAB-FACTS):
# * runtime runc + cgroup_manager cgroupfs: crun 1.8.1 refuses this kind of machine's hybrid cgroups, and
#   there is no systemd to manage scopes; events go to a file for the same reason.
# * default_ulimits: every run fails with `setrlimit RLIMIT_NOFILE: Operation not permitted` (then NPROC)
#   when the runtime asks for more than the caller's hard limits, so ask for exactly the hard limits.
# * one storage.conf from the very first call on a store: mixing --root flags made every `podman run`
#   wait 20 s ("Exceeded conmon timeout"). The store is the project's own (VPNGW_CONTAINERS_STORE, default
#   /var/lib/vpngw/containers): pruning it never touches anyone else's images.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONF_DIR="${VPNGW_CONTAINERS_CONF_DIR:-$ROOT/out/containers}"
STORE="${VPNGW_CONTAINERS_STORE:-/var/lib/vpngw/containers}"

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
}

write_if_changed() {  # path content
  local path=$1 content=$2
  if [ ! -f "$path" ] || [ "$(cat "$path")" != "$content" ]; then
    printf '%s\n' "$content" >"$path.tmp"
    mv "$path.tmp" "$path"
  fi
}

write() {
  mkdir -p "$CONF_DIR"
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  write_if_changed "$CONF_DIR/containers.conf" "# Written by images/containers.sh; rewritten when it differs (do not edit).
[containers]
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]
log_driver = \"k8s-file\"

[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"

[network]
network_backend = \"cni\""
  write_if_changed "$CONF_DIR/storage.conf" "# Written by images/containers.sh; rewritten when it differs (do not edit).
[storage]
driver = \"overlay\"
graphroot = \"$STORE/storage\"
runroot = \"/run/vpngw/containers\"

[storage.options.overlay]
mountopt = \"nodev\""
}

case "${1:-}" in
  write) write ;;
  env)
    printf 'export CONTAINERS_CONF=%q\n' "$CONF_DIR/containers.conf"
    printf 'export CONTAINERS_STORAGE_CONF=%q\n' "$CONF_DIR/storage.conf"
    printf 'export BUILDAH_ISOLATION=chroot\n'
    ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
