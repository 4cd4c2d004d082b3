#!/usr/bin/env bash
# Install a Prometheus server: Debian's `prometheus` package (apt-get, as root), without starting its
# service (the benchmark runs its own server with its own configuration). Prints the version installed.
#   usage: sudo benchmarks/metrics/install_prometheus.sh
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install_prometheus.sh: no apt-get here; install Prometheus from https://prometheus.io/download/" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d 101: the package's maintainer scripts leave the service stopped (no systemd needed).
    policy=/usr/sbin/policy-rc.d
    had_policy=0; [ -e "$policy" ] && had_policy=1
    [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
    trap '[ "$had_policy" = 1 ] || rm -f "$policy"' EXIT
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
prometheus --version 2>&1 | head -1
