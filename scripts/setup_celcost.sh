#!/usr/bin/env bash
# Idempotent build of the lab's CEL cost estimator (lab/celcost: k8s.io/apiextensions-apiserver's own
# estimator at the lab kube-apiserver's release) into .tools/bin/celcost, from the requirements pinned in
# lab/celcost/go.mod and the bytes pinned in its go.sum. scripts/setup_controlplane.sh runs it.
#
# Usage: scripts/setup_celcost.sh [--help | --print-packages | --force]
#   --print-packages  the Debian packages it installs, one per line (none: Go is the machine's own)
#   --force           rebuild even when the stamp says the binary is current
# Exit codes: 0 ok (built, or skipped because current), 1 a step failed, 2 bad usage.
#
# Skipped (milliseconds) when .tools/bin/celcost exists and .tools/celcost.stamp holds the hash of
# go.mod, go.sum, main.go and the build flags. Costs (2 cores): with the Go caches the control plane's
# build leaves, a few seconds (linking); with a cold build cache about 5 minutes (apiserver, cel-go,
# client-go compile). Environment: GO (default: `go` on PATH, else /usr/local/go/bin/go).
set -euo pipefail

case "${1:-}" in
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --print-packages) exit 0 ;;
  --force | "") ;;
  *) echo "setup_celcost: unknown argument ${1@Q} (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

fail() { echo "setup_celcost.failed step=$1 reason='$2'" >&2; exit 1; }

MOD=lab/celcost
BIN=.tools/bin
STAMP=.tools/celcost.stamp
BUILD_SETTINGS="CGO_ENABLED=0 -trimpath -ldflags=-s -w"

key=$( { cat "$MOD/go.mod" "$MOD/go.sum" "$MOD/main.go"; echo "$BUILD_SETTINGS"; } | sha256sum | cut -c1-16)
current() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] && [ -x "$BIN/celcost" ]; }
if [ "${1:-}" != "--force" ] && current; then
  exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[ -x "$GO" ] || fail go "no Go toolchain (set GO, or install Go >= the version in $MOD/go.mod)"

mkdir -p .tools "$BIN"
exec 9>.tools/celcost.lock
flock 9
if [ "${1:-}" != "--force" ] && current; then
  exit 0
fi
start=$(date +%s)
root=$(pwd)
out=$(mktemp -d "$root/.tools/celcost-build.XXXXXX")
trap 'rm -rf "$out"' EXIT
# -mod=readonly: go.sum is the truth, nothing is re-resolved.
(cd "$MOD" && CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -ldflags="-s -w" -o "$out/celcost" .) \
  || fail build "go build in $MOD (its output is above)"
mv -f "$out/celcost" "$BIN/celcost"
echo "$key" >"$STAMP"
echo "setup_celcost.ok seconds=$(($(date +%s) - start))"
