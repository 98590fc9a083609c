#!/usr/bin/env bash
# Idempotent set-up of the kernel tier (lab/vm, docs/vm.md): qemu and busybox from Debian's packages, and
# Debian bookworm's own kernel (the linux-image package pinned below: WireGuard and ESP-in-XFRM as modules,
# which this machine's kernel lacks) fetched with `apt-get download`, unpacked with `dpkg -x` (not
# installed) and its module index built with `depmod -b`, into .tools/vm/<key>/.
#
# Usage: scripts/setup_vm.sh [--help | --print-packages | --print-kernel | --force]
#   --print-packages  the Debian packages it installs, one per line
#   --print-kernel    the unpacked kernel's directory (what lab/vm boots), after setting it up
#   --force           fetch and unpack again even when the stamp says the kernel is current
# Exit codes: 0 ok (set up, or skipped because current), 1 a step failed, 2 bad usage.
#
# Skipped (milliseconds) when the packages are installed and .tools/vm/<key>/stamp exists; the key is the
# hash of the pinned package and version, so a pin change unpacks beside the old one and .tools/vm/current
# (a symlink lab/vm follows) moves to it. Only .tools/vm/ is this script's; .tools is shared with the rest
# of the set-up. Costs (2 cores, docs/vm.md): fresh ~1 min (qemu's packages, ~70 MB of kernel), cached
# a few ms.
set -euo pipefail

APT_PACKAGES=(qemu-system-x86 busybox-static kmod)
# The pin: the newest bookworm kernel the Debian mirror serves (bookworm-security); `apt-cache madison
# linux-image-amd64` shows the current one. A pin the mirror no longer serves fails with that message.
KERNEL_PACKAGE=linux-image-6.1.0-57-amd64
KERNEL_VERSION=6.1.192-3
KERNEL_RELEASE=6.1.0-57-amd64

case "${1:-}" in
  -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --print-packages) printf '%s\n' "${APT_PACKAGES[@]}"; exit 0 ;;
  --force | --print-kernel | "") ;;
  *) echo "setup_vm: unknown argument ${1@Q} (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

fail() { echo "setup_vm.failed step=$1 reason='$2'" >&2; exit 1; }

VM=.tools/vm
key=$(echo "$KERNEL_PACKAGE=$KERNEL_VERSION release=$KERNEL_RELEASE depmod-b:v1" | sha256sum | cut -c1-16)
DIR=$VM/$key
installed() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
  done
}
current() { installed && [ -f "$DIR/stamp" ] && [ "$(readlink "$VM/current" 2>/dev/null)" = "$key" ]; }
report() { [ "${1:-}" = "--print-kernel" ] && echo "$(pwd)/$VM/current"; return 0; }
if [ "${1:-}" != "--force" ] && current; then
  report "${1:-}"
  exit 0
fi

mkdir -p "$VM"
exec 9>"$VM/lock"
flock 9  # two set-ups at once download once
start=$(date +%s)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup_vm: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail apt-update "apt-get update"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || fail apt-install "${missing[*]}"
fi

if [ "${1:-}" = "--force" ] || [ ! -f "$DIR/stamp" ]; then
  rm -rf "$DIR"
  work=$(mktemp -d "$(pwd)/$VM/fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download -qq "$KERNEL_PACKAGE=$KERNEL_VERSION" 2>/dev/null); then
    apt-get update -qq || fail apt-update "apt-get update"
    if ! (cd "$work" && apt-get download -qq "$KERNEL_PACKAGE=$KERNEL_VERSION" 2>/dev/null); then
      # Debian's security archive drops a superseded kernel ABI: a fresh machine would fail here for good.
      # Take the kernel linux-image-amd64 depends on now (same modules, another ABI number), said loudly;
      # the pin above is what to update.
      now=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
      [ -n "$now" ] || fail download "$KERNEL_PACKAGE=$KERNEL_VERSION is not on the mirror, nor linux-image-amd64's kernel"
      ver=$(apt-cache policy "$now" | awk '/Candidate:/ {print $2}')
      echo "setup_vm.warning pin=$KERNEL_PACKAGE=$KERNEL_VERSION gone from the mirror; using $now=$ver (update the pin)" >&2
      KERNEL_PACKAGE=$now KERNEL_VERSION=$ver KERNEL_RELEASE=${now#linux-image-}
      (cd "$work" && apt-get download -qq "$KERNEL_PACKAGE=$KERNEL_VERSION") \
        || fail download "$KERNEL_PACKAGE=$KERNEL_VERSION (linux-image-amd64's kernel) could not be fetched"
    fi
  fi
  dpkg -x "$work"/"$KERNEL_PACKAGE"_*.deb "$work/root" || fail unpack "dpkg -x"
  [ -f "$work/root/boot/vmlinuz-$KERNEL_RELEASE" ] || fail unpack "no boot/vmlinuz-$KERNEL_RELEASE in the package"
  [ -d "$work/root/lib/modules/$KERNEL_RELEASE" ] || fail unpack "no lib/modules/$KERNEL_RELEASE in the package"
  /sbin/depmod -b "$work/root" "$KERNEL_RELEASE" || fail depmod "depmod -b"
  echo "$KERNEL_RELEASE" > "$work/root/release"
  mv "$work/root" "$DIR"
  echo "$KERNEL_PACKAGE=$KERNEL_VERSION" > "$DIR/stamp"
fi
ln -sfn "$key" "$VM/current.new" && mv -T "$VM/current.new" "$VM/current"
echo "setup_vm.ok kernel=$KERNEL_PACKAGE=$KERNEL_VERSION dir=$DIR seconds=$(($(date +%s) - start))" >&2
report "${1:-}"
