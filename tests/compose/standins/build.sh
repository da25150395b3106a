#!/usr/bin/env bash
# Build the stand-in images `make compose-test` runs where the images infra/compose.yml pulls
# cannot be pulled (no registry). Each folder's Dockerfile names the image it replaces and is
# tagged with that image's name and tag; all start from one Debian bookworm rootfs
# (debootstrap, cached in .jobq/compose/) holding the Debian packages of the same versions:
# postgresql-15, redis-server 7.0, prometheus 2.42, prometheus-postgres-exporter 0.11.1,
# python3.11. Grafana has no Debian package: its stand-in only answers /api/health.
#
#   tests/compose/standins/build.sh        # needs DOCKER_HOST of a running engine; root for
#                                          # debootstrap on the first run
#
# The python:3.11-slim stand-in carries a wheelhouse of requirements{,-smtp}.lock (downloaded
# here with pip, hashes checked) and a pip.conf pointing at it, so infra/Dockerfile builds
# unchanged without network access from the build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CACHE="$ROOT/.jobq/compose"
BASE=jobq-standin-base:bookworm
PACKAGES=python3,python3-venv,python-is-python3,postgresql-15,redis-server,redis-tools,prometheus,prometheus-postgres-exporter
mkdir -p "$CACHE"
say() { echo "standins: $*" >&2; }

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if [ ! -f "$CACHE/rootfs.tar" ]; then
        command -v debootstrap >/dev/null || {
            say "installing debootstrap"; apt-get install -y -qq debootstrap >/dev/null; }
        say "debootstrap bookworm with $PACKAGES (once; cached in $CACHE/rootfs.tar)"
        rm -rf "$CACHE/rootfs.tmp"
        debootstrap --variant=minbase --include="$PACKAGES" bookworm "$CACHE/rootfs.tmp" \
            http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1
        # Package caches, docs and the cluster the postgresql package created: not needed.
        rm -rf "$CACHE"/rootfs.tmp/var/cache/apt/archives/*.deb \
            "$CACHE"/rootfs.tmp/var/lib/apt/lists/* "$CACHE"/rootfs.tmp/usr/share/doc \
            "$CACHE"/rootfs.tmp/usr/share/man "$CACHE"/rootfs.tmp/var/lib/postgresql/15 \
            "$CACHE"/rootfs.tmp/etc/postgresql/15
        tar -C "$CACHE/rootfs.tmp" -cf "$CACHE/rootfs.tar.tmp" .
        mv "$CACHE/rootfs.tar.tmp" "$CACHE/rootfs.tar"
        rm -rf "$CACHE/rootfs.tmp"
    fi
    say "importing $BASE"
    docker import --change 'ENV LANG=C.UTF-8' "$CACHE/rootfs.tar" "$BASE" >/dev/null
fi

# The wheelhouse for the python stand-in (the same hashes the image's pip checks).
WHEELS="$HERE/python/wheels"
if [ ! -f "$WHEELS/.complete" ] || [ "$ROOT/requirements.lock" -nt "$WHEELS/.complete" ] \
    || [ "$ROOT/requirements-smtp.lock" -nt "$WHEELS/.complete" ] \
    || [ "$HERE/build.sh" -nt "$WHEELS/.complete" ]; then
    say "downloading the wheels of requirements{,-smtp}.lock"
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    # pip evaluates environment markers against the interpreter running it, not the target
    # (Debian's 3.11.2 needs async-timeout, marked python_full_version < '3.11.3'): drop them.
    for lock in requirements.lock requirements-smtp.lock; do
        sed 's/ ; [^\\]*\\/ \\/' "$ROOT/$lock" >"$WHEELS/$lock"
    done
    "${PIP:-pip}" download --quiet --disable-pip-version-check --require-hashes --no-deps \
        --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any --python-version 3.11 \
        --implementation cp --abi cp311 --abi abi3 --abi none -d "$WHEELS" \
        -r "$WHEELS/requirements.lock" -r "$WHEELS/requirements-smtp.lock" \
        2>"$CACHE/pip.log" || { cat "$CACHE/pip.log" >&2; exit 1; }
    rm "$WHEELS"/requirements*.lock
    ls "$WHEELS"/async_timeout-* >/dev/null
    touch "$WHEELS/.complete"
fi

for dir in python postgres redis prometheus postgres-exporter grafana; do
    image="$(sed -n 's/^# stands in for: //p' "$HERE/$dir/Dockerfile")"
    # The classic builder: no BuildKit frontend image to pull, no network in the build.
    if ! out="$(DOCKER_BUILDKIT=0 docker build --network=none -t "$image" "$HERE/$dir" 2>&1)"; then
        echo "$out" >&2; exit 1
    fi
    say "$image <- tests/compose/standins/$dir"
done
