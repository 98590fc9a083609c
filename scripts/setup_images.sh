#!/usr/bin/env bash
# Idempotent set-up of what building and running the project's container images needs, on a fresh
# Debian 12 machine (run as root): Debian's buildah, podman, runc, skopeo, umoci, the CNI plugins, and
# debootstrap + debuerreotype to make the Debian base image locally (no registry is reachable). Then it
# writes the project's containers configuration (out/containers/, see images/containers.sh).
#
# Usage: scripts/setup_images.sh [--help | --print-packages]
#   --print-packages   print the Debian packages it installs, one per line, and exit
# Exit codes: 0 ok, 1 an install step failed, 2 bad usage.
#
# Installed with --no-install-recommends, and nothing a rootful build and run does not need: the
# Recommends fuse-overlayfs, slirp4netns, catatonit, dbus-user-session and criu are for rootless use,
# pods' infra containers or checkpoints (native overlay works as root; docs/images.md).
# debootstrap verifies the archive with debian-archive-keyring (a Recommends, named here) and gpgv (apt's).
set -euo pipefail

case "${1:-}" in
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "" | --print-packages) ;;
  *) echo "setup_images.usage error='unknown argument ${1}' hint='scripts/setup_images.sh --help'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  buildah podman runc skopeo umoci containernetworking-plugins
  debootstrap debuerreotype debian-archive-keyring ca-certificates
)
if [ "${1:-}" = --print-packages ]; then
  printf '%s\n' "${APT_PACKAGES[@]}"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup_images.failed reason='must run as root (rootful buildah and podman)'" >&2
  exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup_images.installing packages='${missing[*]}'"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bash images/containers.sh write
echo "setup_images.ok buildah='$(buildah --version | awk '{print $3}')' podman='$(podman --version | awk '{print $3}')' runc='$(runc --version | awk 'NR==1{print $3}')' config=out/containers"
