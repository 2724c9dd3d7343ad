#!/usr/bin/env bash
# Build the CPU image (Dockerfile.cpu) with podman on a host that reaches no container
# registry and runs no daemon: a Debian base made here from Debian's packages, then the image
# on top of it, installing through this host's pip configuration, mounted at build time only.
#
# Usage: bash deploy/image/build.sh [TAG]      (default: localhost/nanospec-server:cpu)
# Needs root, podman, runc and debootstrap (apt-get install podman runc debootstrap); about
# 4 minutes on a quiet 2-core host, 14-18.5 at load 12-18, and 8 GB. Run it under `nice` on a
# shared machine.
# Environment: BASE_TAG (default localhost/nanospec-base:bookworm), DEBIAN_MIRROR,
# PYTHON (the Python whose pip configuration to use; default python3), and podman's own
# CONTAINERS_CONF (default: containers.conf beside this script) and CONTAINERS_STORAGE_CONF.
# Serve it: CONTAINERS_CONF=deploy/image/containers.conf \
#   podman run --rm -p 127.0.0.1:30000:30000 -e NANOSPEC_ADMIN_KEY=... TAG --tiny
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tag=${1:-localhost/nanospec-server:cpu}
base=${BASE_TAG:-localhost/nanospec-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
python=${PYTHON:-python3}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_base() {
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs" "$mirror"
    # debootstrap copies the host's resolv.conf and hostname; the runtime supplies its own, so
    # the image must not carry ours. Package caches and lists only add size.
    rm -f "$work/rootfs/etc/resolv.conf" "$work/rootfs/etc/hostname"
    rm -rf "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/cache/apt/archives/*.deb \
        "$work"/rootfs/var/lib/apt/lists/*
    tar -C "$work/rootfs" --numeric-owner -c . \
        | podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$base"
    rm -rf "$work/rootfs"
}

build_image() {
    mkdir "$work/stage"
    local volumes
    volumes=$("$python" "$here/pip_build_config.py" "$work/stage")
    local -a volume_options
    mapfile -t volume_options <<<"$volumes"
    # --network host: the build reaches the registries exactly as the host does (its resolver,
    # routes and any proxy), whatever bridge podman would set up.
    # --format docker: OCI images have no HEALTHCHECK, and the image's would be dropped.
    podman build --network host --format docker --pull=never \
        --build-arg BASE_IMAGE="$base" --build-arg PIP_CONFIG_FILE=/mnt/pip.conf \
        "${volume_options[@]}" -f "$root/Dockerfile.cpu" -t "$tag" "$root"
}

start=$SECONDS
build_base
echo "base image $base built in $((SECONDS - start)) s"
start=$SECONDS
build_image
echo "image $tag built in $((SECONDS - start)) s"
