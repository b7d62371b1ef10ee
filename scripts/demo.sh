#!/usr/bin/env bash
# Set up this machine (if needed) and run the local demo swarm: a relay, four volunteer daemons
# hosting a 4x4 grid of experts, and a trainer that trains examples/train_digits.py through them
# to >= 95% test accuracy, then shows a volunteer's dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo  # the venv only: the tests' browser and peers are not the demo's
exec .venv/bin/python examples/train_digits.py --show-status "$@"
