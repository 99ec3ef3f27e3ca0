#!/usr/bin/env bash
# Nsight Compute counters of sm_90 GEMM routes (rlk.kernels.gemm.sm90_counters), on the GPU machine:
#
#   bash ci/sm90_counters.sh RESULTS_DIR [run options: --routes A,B,cublas --m 144,160 --n 4096 --k 4096]
#
# Profiles only the kernels inside the program's NVTX range, with the clocks left alone
# (--clock-control none) and ncu's default cache control (caches flushed before each kernel: cold
# weights, as the probe times them); writes RESULTS_DIR/sm90_counters.{ncu-rep,csv,json}.
set -euo pipefail
R=${1:?usage: bash ci/sm90_counters.sh RESULTS_DIR [sm90_counters run options]}; shift
mkdir -p "$R"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH=$ROOT/python:$ROOT/kernels${PYTHONPATH:+:$PYTHONPATH}
# ncu on the PATH, else CUDA's, else the newest Nsight Compute under /opt.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort -V | tail -1 || true)
[ -n "$NCU" ] || { echo "sm90_counters: ncu not found"; exit 3; }
"$NCU" --version | tail -1
FLAGS=(--clock-control none --nvtx --nvtx-include "rlk_counters/"
       --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats)
"$NCU" "${FLAGS[@]}" --export "$R/sm90_counters" --force-overwrite \
  python3 -m rlk.kernels.gemm.sm90_counters run --order "$R/sm90_counters_order.json" "$@"
"$NCU" --import "$R/sm90_counters.ncu-rep" --csv --page raw --print-units base > "$R/sm90_counters.csv"
python3 -m rlk.kernels.gemm.sm90_counters report --csv "$R/sm90_counters.csv" \
  --order "$R/sm90_counters_order.json" --out "$R/sm90_counters.json" --tool "ncu ${FLAGS[*]}"
