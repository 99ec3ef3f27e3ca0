#!/usr/bin/env bash
# Bisects the open H200 failure of rollout_test::test_gpu_cuda_graphs_equal_eager[qwen3-0.6b-2]
# (a CUDA graph capture invalidated, "operation failed due to a previous error during capture";
# logs and hypotheses in docs/results/h200_2026-12-02_session8/README.md and
# docs/results/h200_2026-12-02_session9/README.md). It fails only after some earlier tests ran in
# the same process, and which ones depends on the tree: the full `python integrations collectives`
# suite, or `three` (model_test.py, then both rollout params), each fails on some trees and passes
# on others. Each variant changes one thing; a passed / FAILED / NOT RUN line per variant. Run
# through ci/h200_check.sh (STAGES=rollout_bisect), which sets PYTHONPATH, the NCCL/NVLS
# environment and installs .whl/ (carry it: megatron-core).
# BISECT_VARIANTS="three three_eager_modules ..." picks variants.
set -uo pipefail
D=${1:-/tmp}  # where the variants' logs go (h200_check passes its stage folder)
R=python/rlk/replay/rollout_test.py::test_gpu_cuda_graphs_equal_eager
M=python/rlk/models/qwen3/model_test.py
paths="python integrations collectives"
P="-m pytest -m gpu -q -rA -p no:cacheprovider"
run() {  # run NAME ENV... -- PYTHON3_ARGS...
  local name=$1; shift
  case " ${BISECT_VARIANTS:-$ALL} " in *" $name "*) ;; *) return 0 ;; esac
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  timeout 300 env "${envs[@]}" python3 "$@" > "$D/bisect_$name.log" 2>&1
  local rc=$?
  local verdict="0.6b NOT RUN"  # -rA lists every test's outcome in the short summary
  if grep -E "^(FAILED|ERROR) .*qwen3-0.6b" "$D/bisect_$name.log" >/dev/null; then verdict="0.6b FAILED"
  elif grep -E "^PASSED .*qwen3-0.6b" "$D/bisect_$name.log" >/dev/null; then verdict="0.6b passed"; fi
  echo "$name rc=$rc $((SECONDS - t0))s $verdict | $(grep -E '[0-9]+ (passed|failed)' "$D/bisect_$name.log" | tail -n 1)"
}
ALL="baseline no_timeout_plugin python_only no_nvls_env sites_off plans_off three"
run baseline X=1 -- $P $paths --timeout=500
run no_timeout_plugin X=1 -- $P $paths -p no:timeout
run python_only X=1 -- $P python --timeout=500
run no_nvls_env -u NCCL_NVLS_ENABLE -u TORCH_SYMM_MEM_DISABLE_MULTICAST -u NVSHMEM_DISABLE_NVLS -- $P $paths --timeout=500
run sites_off RLK_LAUNCH_SITES=0 -- $P $paths --timeout=500
run plans_off RLK_HOST_PLANS=0 -- $P $paths --timeout=500
# model_test.py's tests, then the tiny and the 0.6b rollout params (the order that fails).
run three X=1 -- $P "$M" "$R" --timeout=500
run three_eager_modules CUDA_MODULE_LOADING=EAGER -- $P "$M" "$R" --timeout=500
run three_gc_off X=1 -- -c "import gc, sys, pytest; gc.disable(); sys.exit(pytest.main('$P'.split()[2:] + ['$M', '$R']))"
run three_no_tiny X=1 -- $P "$M" "$R[qwen3-0.6b-2]" --timeout=500  # without the tiny param
run alone X=1 -- $P "$R[qwen3-0.6b-2]" --timeout=500
grep -h -B2 -A30 "previous error during capture" "$D"/bisect_*.log 2>/dev/null | head -80 || true
