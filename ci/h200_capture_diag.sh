#!/usr/bin/env bash
# Second bisect of the rollout_test CUDA-graph capture failure (docs/results/h200_2026-12-02_session9):
# model_test then rollout_test[qwen3-0.6b-2] in one process failed at aea1715 while the full
# python/ suite passed. Each variant changes one thing; run through ci/h200_check.sh is not
# needed: this script sets PYTHONPATH itself. Usage: bash ci/h200_capture_diag.sh OUT_DIR
set -uo pipefail
D=${1:-/tmp}
export PYTHONPATH=$PWD/python:$PWD/kernels:$PWD/collectives:$PWD/integrations${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 TRITON_CACHE_DIR=/tmp/triton-cache
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # megatron-core (carry .whl/), as h200_check.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
M=python/rlk/models/qwen3/model_test.py::test_gpu_qwen3_8b_shape_two_layers_trainer_vs_rollout
T="python/rlk/replay/rollout_test.py::test_gpu_cuda_graphs_equal_eager[qwen3-0.6b-2]"
run() {  # run NAME ENV... -- PYTHON_ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  timeout 120 env "${envs[@]}" python3 "$@" > "$D/diag_$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s | $(grep -E '[0-9]+ (passed|failed)' "$D/diag_$name.log" | tail -n 1)"
}
P="-m pytest -m gpu -q -rA -p no:cacheprovider"
run repeat X=1 -- $P "$M" "$T"
run alone X=1 -- $P "$T"
run eager_modules CUDA_MODULE_LOADING=EAGER -- $P "$M" "$T"
run gc_off X=1 -- -c "import gc, sys, pytest; gc.disable(); sys.exit(pytest.main('$P'.split()[2:] + ['$M', '$T']))"
grep -h "alloc_retries\|previous error during capture" $D/diag_*.log | sort | uniq -c | head
