#!/usr/bin/env bash
# The checks that need a GPU, in one run (CI has none): the expert tests with experts on CUDA
# (ExpertsConfig's device "auto" picks it), the experts benchmark with --device cuda, and the
# language-model example, locally and through a testnet swarm, with --device cuda.
#
#   bash scripts/gpu_check.sh [OUTDIR]      # OUTDIR: where the logs go (default ./gpu-check)
#
# With the project's venv (scripts/setup.sh) when there is one; else on a machine whose python3
# already has torch with CUDA, the project's other dependencies taken from .whl/ (wheels carried
# to a machine without a registry).
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
python3=python3
if [ -x .venv/bin/python ]; then
    python3=.venv/bin/python
elif compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
if ! "$python3" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU here (torch.cuda.is_available() is false): nothing to check"
    exit 1
fi
mkdir -p "$out"
step() {  # step NAME SECONDS COMMAND...: run it bounded, log it, say how it ended
    local name=$1 seconds=$2
    shift 2
    local started=$SECONDS
    timeout "$seconds" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s"
    tail -n 25 "$out/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python3" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
step tests 210 "$python3" -m pytest -q -p no:cacheprovider -o addopts= \
    tests/unit/test_experts_backend.py tests/unit/test_experts_tensors.py tests/unit/test_experts_scheduler.py \
    tests/unit/test_experts_receipts.py tests/unit/test_trainers.py tests/integration/test_experts_runtime.py \
    tests/integration/test_experts_server.py tests/integration/test_remote_expert.py tests/integration/test_moe.py \
    tests/integration/test_hostile_trainers.py tests/integration/test_exact_audits.py tests/integration/test_train_lm.py
step experts_bench 150 "$python3" benchmarks/experts.py --quick --skip-hivemind --device cuda --torch-threads 4
step lm_local 90 "$python3" examples/train_lm.py --local --device cuda --threads 4 --sample-bytes 0
step lm_swarm 150 "$python3" examples/train_lm.py --device cuda --steps 300 --threads 4 --sample-bytes 0
