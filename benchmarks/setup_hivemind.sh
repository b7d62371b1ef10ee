#!/usr/bin/env bash
# hivemind 1.1.12 in its own venv (.bench/hm), only for the side-by-side benchmarks.
# torch 2.13.0 first so pip takes the CPU build on this machine's disk; retried, since the
# registries are sometimes down for minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VOLUNTEER_HIVEMIND_VENV:-.bench/hm}
retry() { local n=1; until "$@"; do [ $n -ge 5 ] && return 1; echo "retry $n: $*" >&2; n=$((n+1)); sleep 20; done; }
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import hivemind" 2>/dev/null; then
    echo "hivemind already in $VENV"; exit 0
fi
python3 -m venv "$VENV"
retry "$VENV/bin/pip" install -q --upgrade pip
retry "$VENV/bin/pip" install -q torch==2.13.0
retry "$VENV/bin/pip" install -q hivemind==1.1.12
"$VENV/bin/python" -c "import hivemind; print('hivemind', hivemind.__version__, 'in $VENV')"
