#!/usr/bin/env bash
# Bisects the 2026-12-02 H200 failure of rollout_test::test_gpu_cuda_graphs_equal_eager[qwen3-0.6b-2]
# (docs/results/h200_2026-12-02_session8/README.md): it failed 2 of 2 times in the full
# `STAGES=tests_python` run with megatron-core importable and passed 4 of 4 times in one pytest
# process running only the four GPU tests before it. Each variant below drops one difference;
# the first that passes names the cause. Run through ci/h200_check.sh (STAGES=rollout_bisect),
# which sets PYTHONPATH, the NCCL/NVLS environment and installs .whl/ (carry it: megatron-core).
set -uo pipefail
D=${1:-/tmp}  # where the variants' logs go (h200_check passes its stage folder)
T=python/rlk/replay/rollout_test.py::test_gpu_cuda_graphs_equal_eager
paths="python integrations collectives"
run() {  # run NAME ENV... -- PYTEST_ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  env "${envs[@]}" python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$@" > "$D/bisect_$name.log" 2>&1
  local rc=$?
  local verdict="0.6b NOT RUN"  # -rA lists every test's outcome in the short summary
  if grep -E "^(FAILED|ERROR) .*qwen3-0.6b" "$D/bisect_$name.log" >/dev/null; then verdict="0.6b FAILED"
  elif grep -E "^PASSED .*qwen3-0.6b" "$D/bisect_$name.log" >/dev/null; then verdict="0.6b passed"; fi
  echo "$name rc=$rc $((SECONDS - t0))s $verdict | $(tail -n 1 "$D/bisect_$name.log")"
}
run baseline X=1 -- $paths --timeout=500
run no_timeout_plugin X=1 -- $paths -p no:timeout
run python_only X=1 -- python --timeout=500
run no_nvls_env -u NCCL_NVLS_ENABLE -u TORCH_SYMM_MEM_DISABLE_MULTICAST -u NVSHMEM_DISABLE_NVLS -- $paths --timeout=500
run sites_off RLK_LAUNCH_SITES=0 -- $paths --timeout=500
run plans_off RLK_HOST_PLANS=0 -- $paths --timeout=500
run two_tests X=1 -- python/rlk/models/qwen3/model_test.py "$T" --timeout=500
grep -h -B2 -A30 "previous error during capture" $D/bisect_baseline.log | head -80
