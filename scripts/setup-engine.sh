#!/usr/bin/env bash
# Gets a real Docker engine, the registry binary and the test base image on a Debian machine
# like the CI one (see README, "Setup and the main job"). Idempotent: each step is skipped
# when its result is already there.
set -euo pipefail

BASE_TAG="${ENVBUILD_TEST_BASE:-envbuild-test/debian:bookworm}"
SUITE="${ENVBUILD_TEST_SUITE:-bookworm}"

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
[ -x /usr/bin/docker-registry ] || need_pkgs+=(docker-registry)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo "setup-engine: installing ${need_pkgs[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}"
fi

# The Debian client speaks the engine's API version and carries the classic BuildKit path.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker

if ! "$DOCKER" info >/dev/null 2>&1; then
  echo "setup-engine: starting dockerd"
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$DOCKER" info >/dev/null 2>&1 || { echo "setup-engine: dockerd did not come up; see /var/log/dockerd.log" >&2; tail -20 /var/log/dockerd.log >&2; exit 1; }
fi
echo "setup-engine: engine $("$DOCKER" version --format '{{.Server.Version}}') answering"

if ! "$DOCKER" image inspect "$BASE_TAG" >/dev/null 2>&1; then
  echo "setup-engine: debootstrapping $SUITE into $BASE_TAG"
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" http://deb.debian.org/debian >/tmp/debootstrap.log 2>&1 \
    || { tail -20 /tmp/debootstrap.log >&2; exit 1; }
  tar -C "$rootfs" -c . | "$DOCKER" import - "$BASE_TAG" >/dev/null
fi
echo "setup-engine: base image $BASE_TAG present"
