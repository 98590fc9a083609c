#!/usr/bin/env bash
# Idempotent build of the lab's real control plane: kube-apiserver, kube-controller-manager and etcd,
# compiled with `go build` from the releases pinned in lab/controlplane/go.mod (k8s.io/kubernetes and its
# staging modules, go.etcd.io/etcd/server/v3) and the bytes pinned in its go.sum, into .tools/bin.
# Nothing of their source is in the repository: the Go module proxy serves it (no prebuilt
# kube-apiserver is reachable from these machines; docs/controlplane.md).
#
# Usage: scripts/setup_controlplane.sh [--help | --print-packages | --force]
#   --print-packages  the Debian packages it installs, one per line (none: Go is the machine's own)
#   --force           rebuild even when the stamp says the binaries are current
# Exit codes: 0 ok (built, or skipped because current), 1 a step failed, 2 bad usage.
#
# Skipped (milliseconds) when .tools/bin has the three binaries and .tools/controlplane.stamp holds the
# hash of go.mod, go.sum and the build flags below: a pin change rebuilds. Costs (2 cores, measured in
# docs/controlplane.md): a fresh machine downloads ~90 MB of module zips (0.5 GB unpacked) and compiles
# for ~20-25 minutes (19 CPU-minutes; 2.7 GB of build cache); with warm Go caches ~45 s (linking).
# Go's own module and build caches (`go env GOMODCACHE GOCACHE`) are used, so a second checkout on the
# machine reuses them. Environment: GO (default: `go` on PATH, else /usr/local/go/bin/go), at least
# the Go version go.mod names.
set -euo pipefail

case "${1:-}" in
  -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --print-packages) exit 0 ;;
  --force | "") ;;
  *) echo "setup_controlplane: unknown argument ${1@Q} (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

fail() { echo "setup_controlplane.failed step=$1 reason='$2'" >&2; exit 1; }

# The CEL cost estimator (lab/celcost): the apiextensions-apiserver of the same release, its own stamp.
bash scripts/setup_celcost.sh "$@" || fail celcost "scripts/setup_celcost.sh (its output is above)"

MOD=lab/controlplane
BIN=.tools/bin
STAMP=.tools/controlplane.stamp
BINARIES=(kube-apiserver kube-controller-manager etcd)
# As Kubernetes' release build (hack/lib/golang.sh): static, trimmed paths, no symbol tables, and the
# tags it builds with (grpcnotrace drops x/net/trace so the linker can drop more).
TAGS=selinux,notest,grpcnotrace
BUILD_SETTINGS="CGO_ENABLED=0 -trimpath -tags=$TAGS -ldflags=-s -w version-vars:v1"

key=$( { cat "$MOD/go.mod" "$MOD/go.sum"; echo "$BUILD_SETTINGS"; } | sha256sum | cut -c1-16)
current() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] || return 1
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}
if [ "${1:-}" != "--force" ] && current; then
  exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[ -x "$GO" ] || fail go "no Go toolchain (set GO, or install Go >= the version in $MOD/go.mod)"

mkdir -p .tools "$BIN"
exec 9>.tools/controlplane.lock
flock 9  # two set-ups at once (two shells, CI and a developer) build once
if [ "${1:-}" != "--force" ] && current; then
  exit 0
fi

start=$(date +%s)
root=$(pwd)
echo "setup_controlplane.build go='$("$GO" version)' gomodcache=$("$GO" env GOMODCACHE) gocache=$("$GO" env GOCACHE)"
cd "$MOD"
# Release versions and dates from the pinned modules themselves (the proxy's .info), so the binaries
# report what they are: kube-apiserver's /version and kubectl's skew check read gitVersion (a plain
# `go build` would say v0.0.0-master), the emulation version is derived from it, and client-go's
# User-Agent carries it. The proxy gives no commit, so gitCommit stays unset.
read -r kver kdate < <("$GO" list -mod=readonly -m -f '{{.Version}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' \
  k8s.io/kubernetes) || fail version "go list k8s.io/kubernetes"
read -r ever < <("$GO" list -mod=readonly -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) || fail version "go list etcd"
[[ "$kver" =~ ^v([0-9]+)\.([0-9]+)\. ]] || fail version "unexpected k8s.io/kubernetes version $kver"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$kdate"
done
# etcd's own version (3.6.x) is a constant; only its Git SHA is a build-time variable.
ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=go-module-$ever"

out=$(mktemp -d "$root/.tools/controlplane-build.XXXXXX")
trap 'rm -rf "$out"' EXIT
# One `go build` for all three: the packages they share (client-go, apimachinery, grpc, ...) compile once
# and in parallel. -mod=readonly: go.sum is the truth, nothing is re-resolved.
CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -tags="$TAGS" -ldflags="$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager go.etcd.io/etcd/server/v3 \
  || fail build "go build in $MOD (its output is above)"
cd "$root"
mv "$out/server" "$out/etcd"  # `go build -o DIR/` names server/v3's main after "server"
for b in "${BINARIES[@]}"; do
  [ -x "$out/$b" ] || fail build "$b was not built"
  mv -f "$out/$b" "$BIN/$b"
done
echo "$key" >"$STAMP"
echo "setup_controlplane.ok kubernetes=$kver etcd=$ever seconds=$(($(date +%s) - start))" \
  "sizes_mb='$(cd "$BIN" && du -m "${BINARIES[@]}" | awk '{printf "%s=%s ", $2, $1}')'"
