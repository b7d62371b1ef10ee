#!/usr/bin/env bash
# Set up everything on a fresh machine: system packages for the NAT rig, the project's venv
# (torch's CPU build first), and the real libp2p peers used by the interop tests.
# Registries sometimes drop for minutes: every install is retried with a pause.
set -euo pipefail
cd "$(dirname "$0")/.."
# --demo: only what the demo swarm runs (the venv with the examples' packages): no browser, no NAT
# rig packages, no real libp2p peers, no test packages (those are for the tests: chromium alone is
# some 300 MB, the peers' hivemind venv 1.2 GB)
DEMO=0
[ "${1:-}" = "--demo" ] && DEMO=1

retry() {
    local attempt=1
    until "$@"; do
        if [ "$attempt" -ge 6 ]; then echo "giving up after $attempt tries: $*" >&2; return 1; fi
        echo "try $attempt failed: $*; retrying in 20 s" >&2
        attempt=$((attempt + 1))
        sleep 20
    done
}

# iproute2 + nftables/iptables for tests/nat (network namespaces), miniupnpd for its port-mapping
# home router; tmux for the TUI tests; chromium + chromium-driver for the web page's browser tests
# (headless, driven by selenium).
if [ "$DEMO" = 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=""
    for cmd in ip:iproute2 nft:nftables iptables:iptables miniupnpd:miniupnpd-nftables tmux:tmux chromium:chromium chromedriver:chromium-driver; do
        command -v "${cmd%%:*}" >/dev/null || missing="$missing ${cmd##*:}"
    done
    if [ -n "$missing" ]; then
        retry apt-get update -q
        retry env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
    fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
retry .venv/bin/pip install -q --upgrade pip
# torch first, pinned, so pip takes the CPU build that lies on this machine's disk.
.venv/bin/python -c "import torch" 2>/dev/null || retry .venv/bin/pip install -q torch==2.13.0
# the demo needs the examples' packages only (scikit-learn's digits); the tests need their own too
EXTRAS="test,examples"
[ "$DEMO" = 1 ] && EXTRAS="examples"
retry .venv/bin/pip install -q -e ".[$EXTRAS]"

# Real libp2p peers (py-libp2p 0.8.1 in its own venv, go-libp2p's p2pd from hivemind's wheel).
if [ "$DEMO" = 0 ] && [ -f .ci/install_peers.sh ]; then
    retry bash .ci/install_peers.sh
fi
echo "setup done: .venv/bin/volunteer is ready"
