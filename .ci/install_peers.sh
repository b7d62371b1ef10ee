#!/usr/bin/env bash
# Install the real libp2p peers the interop tests and benchmarks run against, into DEST
# (default .interop, git-ignored):
#   DEST/pylibp2p   a venv with py-libp2p 0.8.1 (its pins clash with ours, hence its own venv)
#   DEST/bin/p2pd   go-libp2p's daemon (v0.32), taken out of hivemind 1.1.12's wheel
# Idempotent; each install is retried by the caller (scripts/setup.sh) when a registry drops.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.interop}
mkdir -p "$DEST/bin" "$DEST/dl"
PYTHON=${PYTHON:-python3}

if ! "$DEST/pylibp2p/bin/python" -c "import libp2p, importlib.metadata as m; assert m.version('libp2p') == '0.8.1'" 2>/dev/null; then
    rm -rf "$DEST/pylibp2p"
    "$PYTHON" -m venv "$DEST/pylibp2p"
    "$DEST/pylibp2p/bin/pip" install -q --upgrade pip
    "$DEST/pylibp2p/bin/pip" install -q "libp2p==0.8.1"
    echo "installed py-libp2p 0.8.1 in $DEST/pylibp2p"
fi

if ! "$DEST/bin/p2pd" -h >/dev/null 2>&1; then
    "$PYTHON" -m pip download -q --no-deps "hivemind==1.1.12" -d "$DEST/dl"
    wheel=$(ls "$DEST"/dl/hivemind-1.1.12-*.whl | head -n 1)
    "$PYTHON" - "$wheel" "$DEST/bin/p2pd" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("hivemind/hivemind_cli/p2pd") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod +x "$DEST/bin/p2pd"
    "$DEST/bin/p2pd" -h >/dev/null 2>&1 || { echo "p2pd does not run" >&2; exit 1; }
    echo "installed p2pd (go-libp2p) in $DEST/bin"
fi

# hivemind 1.1.12 itself (its own venv, torch's CPU build first) for the hivemind interop tests
# and the side-by-side benchmarks.
bash benchmarks/setup_hivemind.sh
