#!/usr/bin/env bash
# Set up this machine (if needed) and run the local demo swarm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m volunteer.demo "$@"
