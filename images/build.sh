#!/usr/bin/env bash
# Build the project's container images here, without a registry (docs/images.md):
#   1. the Debian base: debootstrap --variant=minbase bookworm through debuerreotype (Debian's own tool for
#      its official images: minimizing config, dist-upgrade, slimify, a reproducible tar), with the host's
#      apt sources, imported as localhost/debian:<point release>-slim. Cached by a key: the recipe, the
#      sources and the Version/Date of every suite's Release file, so it is rebuilt exactly when Debian
#      publishes something (a point release, a security or a stable update) or the recipe changes;
#   2. the gateway and controller images with buildah (--pull=never, chroot isolation, layer cache), from
#      contexts staged by images/imagectl.py (only the product packages and runtime dependencies each
#      image's programs import);
#   3. the OCI archives out/gateway.oci.tar and out/controller.oci.tar (skopeo copy / podman load);
#   4. each image's inventory (out/<image>.inventory), compared with its lock images/<image>/packages.lock.
#
# Usage: images/build.sh [--update-lock] [--help]
#   --update-lock   resolve Python dependencies afresh (no constraints) and write the locks from what
#                   the build resolved (and the base's point release into the Dockerfiles); review the diff
# Environment: VPNGW_APT_SOURCES (apt sources file for the base; default the host's),
#   VPNGW_BUILD_CA (CA bundle pip trusts during the build; default the host's),
#   VPNGW_IMAGE_TAG (default: pyproject's version), VPNGW_CONTAINERS_STORE (images/containers.sh).
# Exit codes: 0 built (lock drift is reported, not fatal: the CI check decides), 1 a build step failed,
# 2 bad usage.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
UPDATE_LOCK=0
for arg in "$@"; do
  case "$arg" in
    --update-lock) UPDATE_LOCK=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "images.build.usage error='unknown argument $arg' hint='images/build.sh --help'" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/out"
PY="$ROOT/.venv/bin/python"
IMAGES=(gateway controller)
SUITE=bookworm
# Bump when the base recipe below changes: it is part of the base's cache key.
BASE_RECIPE="debuerreotype-init --non-debian minbase; minimizing-config; host sources; dist-upgrade; slimify; debuerreotype-tar; v1"
STARTED=$SECONDS

log() { echo "$*" >&2; }
fail() { log "images.build.failed step=$1 error=${2@Q}"; exit 1; }

[ "$(id -u)" = 0 ] || fail preflight "must run as root (rootful buildah and podman)"
for tool in buildah podman skopeo debuerreotype-init debootstrap wget; do
  command -v "$tool" >/dev/null || fail preflight "$tool is missing: run scripts/setup_images.sh"
done
[ -x "$PY" ] || fail preflight ".venv/bin/python is missing: run scripts/setup.sh"

mkdir -p "$OUT"
exec 9>"$OUT/.images-build.lock"
flock 9  # one build at a time per checkout: the steps below share out/ and the store

bash images/containers.sh write
eval "$(bash images/containers.sh env)"

APT_SOURCES="${VPNGW_APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}"
[ -f "$APT_SOURCES" ] || APT_SOURCES=/etc/apt/sources.list
[ -f "$APT_SOURCES" ] || fail preflight "no apt sources file (set VPNGW_APT_SOURCES)"
BUILD_CA="${VPNGW_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
[ -f "$BUILD_CA" ] || fail preflight "no CA bundle at $BUILD_CA (set VPNGW_BUILD_CA)"
TAG="${VPNGW_IMAGE_TAG:-$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}"

WORK=""
MOUNTED=()
cleanup() {
  local rc=$?
  for img in "${MOUNTED[@]}"; do podman image unmount "$img" >/dev/null 2>&1 || true; done
  [ -n "$WORK" ] && rm -rf "$WORK"
  # Working containers a failed or interrupted build left behind (buildah's own, never podman's).
  buildah containers --quiet 2>/dev/null | xargs -r buildah rm >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
WORK="$(mktemp -d "$OUT/.build.XXXXXX")"
buildah containers --quiet | xargs -r buildah rm >/dev/null  # a killed run's leftovers

# --- 1. the Debian base ---------------------------------------------------------------------------------
mapfile -t SOURCES < <("$PY" - "$APT_SOURCES" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
if sys.argv[1].endswith(".sources"):  # deb822
    for stanza in re.split(r"\n\s*\n", text):
        f = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
        if "deb" in f.get("Types", "").split():
            for uri in f.get("URIs", "").split():
                for suite in f.get("Suites", "").split():
                    print(uri.rstrip("/"), suite)
else:
    for line in text.splitlines():
        m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
        if m:
            print(m.group(1).rstrip("/"), m.group(2))
EOF
)
[ "${#SOURCES[@]}" -gt 0 ] || fail base "no 'deb' entries in $APT_SOURCES"
MIRROR=""
KEY_MATERIAL="$BASE_RECIPE|$(dpkg --print-architecture)|$(cat "$APT_SOURCES")"
RELEASE=""
ARCHIVE_STATE=""
for entry in "${SOURCES[@]}"; do
  uri=${entry% *} suite=${entry#* }
  release_file="$(wget -qO- "$uri/dists/$suite/InRelease")" || fail base "cannot fetch $uri/dists/$suite/InRelease"
  fields="$(grep -E '^(Version|Date):' <<<"$release_file" | tr '\n' ' ')"
  KEY_MATERIAL+="|$suite $fields"
  ARCHIVE_STATE+="$suite $(awk -F': ' '$1 == "Date" { print $2; exit }' <<<"$release_file"); "
  if [ "$suite" = "$SUITE" ] && [ -z "$MIRROR" ]; then
    MIRROR=$uri
    RELEASE="$(awk '$1 == "Version:" { print $2; exit }' <<<"$release_file")"
  fi
done
[ -n "$MIRROR" ] || fail base "no '$SUITE' suite in $APT_SOURCES"
KEY="$(printf '%s' "$KEY_MATERIAL" | sha256sum | cut -c1-16)"
BASE="localhost/debian:$RELEASE-slim"
have_key="$(podman image inspect --format '{{index .Labels "net.bnerd.vpn.base-key"}}' "$BASE" 2>/dev/null || true)"
if [ "$have_key" = "$KEY" ]; then
  log "images.base.cached image=$BASE key=$KEY"
else
  t0=$SECONDS
  rootfs="$WORK/rootfs"
  log "images.base.building image=$BASE key=$KEY mirror=$MIRROR"
  debuerreotype-init --non-debian "$rootfs" "$SUITE" "$MIRROR" >"$WORK/base.log" 2>&1 \
    || { tail -20 "$WORK/base.log" >&2; fail base "debootstrap failed (log above)"; }
  debuerreotype-minimizing-config "$rootfs"
  rm -f "$rootfs/etc/apt/sources.list"
  mkdir -p "$rootfs/etc/apt/sources.list.d"
  case "$APT_SOURCES" in
    *.sources) cp "$APT_SOURCES" "$rootfs/etc/apt/sources.list.d/debian.sources" ;;
    *) cp "$APT_SOURCES" "$rootfs/etc/apt/sources.list" ;;
  esac
  {
    debuerreotype-apt-get "$rootfs" update -qq
    debuerreotype-apt-get "$rootfs" dist-upgrade -yqq
    debuerreotype-slimify "$rootfs"
  } >>"$WORK/base.log" 2>&1 || { tail -20 "$WORK/base.log" >&2; fail base "apt in the base failed (log above)"; }
  built_release="$(cat "$rootfs/etc/debian_version")"
  [ "$built_release" = "$RELEASE" ] || fail base "the mirror says $RELEASE, the root file system $built_release"
  debuerreotype-tar "$rootfs" "$WORK/base.tar"
  podman import --quiet --change 'CMD ["bash"]' --change "LABEL net.bnerd.vpn.base-key=$KEY" \
    "$WORK/base.tar" "$BASE" >/dev/null
  rm -rf "$rootfs" "$WORK/base.tar"
  log "images.base.built image=$BASE key=$KEY seconds=$((SECONDS - t0))"
fi

# --- 2.-4. the images ------------------------------------------------------------------------------------
declare -A SIZE SECS
for name in "${IMAGES[@]}"; do
  t0=$SECONDS
  ref="localhost/vpngw-$name:$TAG"
  ctx="$OUT/build/$name"
  lock="images/$name/packages.lock"
  lock_args=()
  if [ "$UPDATE_LOCK" = 0 ] && [ -f "$lock" ]; then lock_args=(--lock "$lock"); fi
  "$PY" images/imagectl.py context "$name" "$ctx" "${lock_args[@]}" >&2 || fail "context-$name" "staging failed"
  # The build stage is built and tagged on its own first: a stage nothing tagged sits on would be pruned
  # below as dangling, and its layer cache with it (buildah 1.28 then re-runs pip on every build).
  for target in build final; do
    if [ "$target" = build ]; then stage=(--target build -t "localhost/vpngw-$name-build:$TAG"); else stage=(-t "$ref"); fi
    buildah build --quiet --layers --pull=never --isolation chroot \
      --secret "id=pipca,src=$BUILD_CA" \
      --build-arg "DEBIAN_RELEASE=$RELEASE" \
      "${stage[@]}" -f "images/$name/Dockerfile" "$ctx" >/dev/null 2>"$WORK/$name.log" \
      || { tail -40 "$WORK/$name.log" >&2; fail "build-$name" "buildah build failed (log above; a pip conflict with constraints.txt means a stale Python lock: --update-lock)"; }
  done
  id="$(podman image inspect --format '{{.Id}}' "$ref")"

  mnt="$(podman image mount "$ref")"
  MOUNTED+=("$ref")
  "$PY" images/imagectl.py inventory "$mnt" \
    --header "images/$name/packages.lock: what images/build.sh resolved for the $name image (docs/images.md)." \
    --header "Regenerate with: images/build.sh --update-lock. Checked by tests/integration/test_images_lock.py." \
    --header "Resolved from the archive as of: ${ARCHIVE_STATE}base key $KEY (snapshot.debian.org has these states)." \
    >"$OUT/$name.inventory"
  podman image unmount "$ref" >/dev/null
  MOUNTED=()
  if [ "$UPDATE_LOCK" = 1 ]; then
    cp "$OUT/$name.inventory" "$lock"
    sed -i -E "s/^ARG DEBIAN_RELEASE=.*/ARG DEBIAN_RELEASE=$RELEASE/" "images/$name/Dockerfile"
    log "images.lock.written image=$name lock=$lock"
  elif [ -f "$lock" ]; then
    "$PY" images/imagectl.py check "$lock" "$OUT/$name.inventory" --image "$name" >&2 || true
  else
    log "images.lock.missing image=$name hint='images/build.sh --update-lock'"
  fi

  archive="$OUT/$name.oci.tar"
  if [ -f "$archive" ] && [ "$(cat "$archive.id" 2>/dev/null)" = "$id" ]; then
    log "images.archive.cached image=$name archive=out/$name.oci.tar"
  else
    rm -f "$archive" "$archive.id"
    buildah push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null
    echo "$id" >"$archive.id"
  fi
  SIZE[$name]="$(podman image inspect --format '{{.Size}}' "$ref")"
  SECS[$name]=$((SECONDS - t0))
  log "images.built image=$ref id=${id:0:12} size_mb=$((SIZE[$name] / 1000000)) archive_mb=$(($(stat -c %s "$archive") / 1000000)) seconds=${SECS[$name]}"
done

# Bounded store: the layers of superseded builds and bases (dangling images) go; the current images'
# layers and their build cache stay.
podman image prune --force >/dev/null
echo "images.done tag=$TAG base=$BASE gateway_mb=$((SIZE[gateway] / 1000000)) controller_mb=$((SIZE[controller] / 1000000)) seconds=$((SECONDS - STARTED))"
