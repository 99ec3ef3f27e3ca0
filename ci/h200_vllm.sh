#!/usr/bin/env bash
# vLLM 0.26.0 on the H200: the three arms of rlk.integrations.vllm.engine_bench, in stages.
#
#   STAGES="stage2 prepare arm_rlk ..." bash ci/h200_vllm.sh  # carry .vllm_bundle/{manifest.json,part-aa}
# (a bundle of several parts: STAGES=stage1 with part-aa first, then stage2 with the rest in the
# next call on the same warm machine)
#
# Stages, in this order: stage1 stage2 prepare arm_rlk arm_stock arm_batch_invariant (named only:
# arm_rlk_eager, arm_rlk_mrv1) compare report
# baselines (rlk's kernels vs vLLM's own, rlk.integrations.vllm.kernel_baselines_bench)
# prod_pairs prod_report (rlk.integrations.production.bench: paired P/P vs R/R, vLLM rollout +
# megatron-core trainer, results under $R/production; complete pairs are skipped, so the pairs
# can be spread over several calls (a new pair on another tree or machine than the earlier
# ones is refused before it runs, exit 4): PROD_PAIRS (default 5), PROD_LIMIT (s, default 560; the
# runner stops before a pair that would not fit), PROD_RESULTS (default $R/production), PROD_ARGS (e.g. "--workload W1 --micro-tokens 16384";
# "--profile" adds the attribution: every phase repeated once under the profiler, not counted;
# "--profile --profile-pairs 1" profiles pair 1 only))
# rl_loop_vllm (the GRPO loop with vLLM as rollout engine: RL_ROUTE strict = vLLM + rlk's plugin,
# native = stock vLLM, both = one arm after the other; RL_STEPS, RL_ENGINE_MEMORY, RL_TRAINER, RL_LAYERS, RL_ARGS;
# RL_TRANSPORT=inproc: vLLM in the loop's process, the sync hands it the trainer's tensors, one route per call;
# RL_ARGS="--recompute full" for megatron at full depth),
# gate (the release gate, profile h200, all levels; its L5 is one production pair).
# Everything but stage1 needs the extracted bundle (ci/vllm_bundle.sh). The checkpoint ($CKPT)
# and results ($R) live under /tmp/rlk_vllm, which survives between calls while the machine stays
# warm; $OUT/results.tgz (JSON, logs, token files) and $OUT/summary.txt come back after every
# stage. Variables: WORKLOADS (default W0,W1,W2), CONFIG (qwen3-8b), SEED (0), RECIPE, LAYERS,
# ARM_LIMIT (s per arm, 420; ARM_LIMIT_BI for the batch-invariant arm), COMPARE_ARGS, PROFILE (non-empty: attribution of stock and rlk;
# PROFILE_ARGS e.g. "--profile-workload W2 --profile-tokens 128"; "--profile-prompt-len 16" for a decode-heavy trace).
# A/B of sm_90 route tables in the engine: the same stages with R=DIR_A and R=DIR_B, the second with
# RLK_GEMM_SM90_TABLE=<table JSON> (the engine's processes inherit it; the provenance names each table's sha256),
# e.g. WORKLOADS=W2 STAGES="arm_rlk arm_stock", one process per table and arm, then `report` per folder.
set -uo pipefail
OUT=${OUT:-$PWD/out/h200_vllm}
DEV=${RLK_VLLM_DIR:-/tmp/rlk_vllm}
R=${R:-$DEV/results}
CKPT=${CKPT:-$DEV/ckpt}
mkdir -p "$OUT" "$R"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TRITON_CACHE_DIR=/tmp/triton-cache
STAGES=${STAGES:-"stage2 prepare arm_rlk arm_stock arm_batch_invariant compare report"}
WORKLOADS=${WORKLOADS:-W0,W1,W2}
SUMMARY=$OUT/summary.txt
touch "$SUMMARY"

STAGE_EXCLUDE="*_trace" STAGE_TAIL=15
. "$(dirname "${BASH_SOURCE[0]}")/h200_stages.sh"

stage stage1 120 bash ci/vllm_bundle.sh stage1
stage stage2 180 bash ci/vllm_bundle.sh stage2
if [ -f "$DEV/site/.rlk_bundle_sha256" ]; then eval "$(bash ci/vllm_bundle.sh env)"; fi
BENCH="python3 -m rlk.integrations.vllm.engine_bench"
stage prepare 300 $BENCH prepare --dir "$CKPT" --config "${CONFIG:-qwen3-8b}" --seed "${SEED:-0}" \
  ${RECIPE:+--recipe "$RECIPE"} ${LAYERS:+--layers "$LAYERS"}
[ -f "$CKPT/rlk_checkpoint.json" ] && cp "$CKPT/rlk_checkpoint.json" "$R/checkpoint.json"
# The batch-invariant arm needs about 100 s more than the others (engine start with its kernels,
# W2 at a third of stock's speed): its limit is ARM_LIMIT_BI (default ARM_LIMIT + 100).
for arm in rlk stock batch_invariant; do
  limit=${ARM_LIMIT:-420}
  [ "$arm" = batch_invariant ] && limit=${ARM_LIMIT_BI:-$((limit + 100))}
  stage "arm_$arm" "$limit" $BENCH arm --arm "$arm" --dir "$CKPT" --out "$R/arm_$arm.json" \
    --workloads "$WORKLOADS" ${PROFILE:+--profile ${PROFILE_ARGS:-}}
done
# Diagnostics, only when named: the rlk arm without CUDA graphs; the rlk arm on vLLM's V1 model
# runner (the default on a GPU is Model Runner V2, stock's runner; `compare` checks its bits too).
stage arm_rlk_eager "${ARM_LIMIT:-420}" $BENCH arm --arm rlk --eager --dir "$CKPT" --out "$R/arm_rlk_eager.json" \
  --workloads "$WORKLOADS"
stage arm_rlk_mrv1 "${ARM_LIMIT:-420}" $BENCH arm --arm rlk --model-runner v1 --dir "$CKPT" \
  --out "$R/arm_rlk_mrv1.json" --workloads "$WORKLOADS"
stage compare 420 $BENCH compare --dir "$CKPT" --arms $(ls "$R"/arm_*.json 2>/dev/null) --out "$R/compare.json" \
  ${COMPARE_ARGS:-}
stage report 60 $BENCH report --results "$R" --out "$R/vllm_h200.json"
stage baselines 300 python3 -m rlk.integrations.vllm.kernel_baselines_bench --out "$R/kernel_baselines_h200.json"
PROD="python3 -m rlk.integrations.production.bench"
PROD_LIMIT=${PROD_LIMIT:-560}
PROD_R=${PROD_RESULTS:-$R/production}
stage prod_pairs "$PROD_LIMIT" $PROD pairs --dir "$CKPT" --results "$PROD_R" --n "${PROD_PAIRS:-5}" \
  --budget-s "$((PROD_LIMIT - 30))" ${PROD_ARGS:-}
stage prod_report 120 $PROD report --results "$PROD_R" --out "$PROD_R/e2e_production_h200.json"
# The RL loop with vLLM as its rollout engine (strict route: rlk's plugin; native: stock vLLM):
# Qwen3-8B shapes, rlk's trainer with Adam on the host, vLLM taking RL_ENGINE_MEMORY of the GPU beside it;
# each step's weight sync goes through a safetensors file and collective_rpc (rlk.rl --engine vllm).
# RL_TRAINER=megatron: megatron-core's GPTModel is the actor, on rlk's spec (strict) or its local spec (native;
# RL_ROUTE=both: the production pair as a loop); its DDP main_grad and Adam stay on the GPU (18 bytes/param), so
# RL_LAYERS keeps the real widths and LM head within one card beside vLLM (4 layers ran on an 80 GB H100), or
# RL_OFFLOAD=FRACTION moves that fraction's fp32 main parameters and Adam moments to the host (megatron's offload).
# RL_ARGS: more of rlk.rl's options.
if [ "${RL_TRAINER:-rlk}" = megatron ]; then RL_ACTOR="--trainer megatron ${RL_OFFLOAD:+--optimizer-offload $RL_OFFLOAD}"
else RL_ACTOR="--optimizer-offload"; fi
stage rl_loop_vllm "${RL_LIMIT:-560}" python3 -m rlk.rl --engine vllm --route "${RL_ROUTE:-strict}" --device cuda --model qwen3-8b \
  $RL_ACTOR ${RL_LAYERS:+--layers "$RL_LAYERS"} --task token_class --prompts 4 --group-size 8 --response-len 128 --lr 1e-4 \
  --steps "${RL_STEPS:-5}" --engine-memory "${RL_ENGINE_MEMORY:-0.3}" ${RL_TRANSPORT:+--engine-transport "$RL_TRANSPORT"} \
  --tag h200_vllm --quiet --out "$R/rl_loop_vllm" ${RL_ARGS:-}
# The release gate, profile h200, all levels, in the bundle's environment (L5 is the production
# pair: vLLM and megatron-core must be importable); the checkpoint of `prepare` is reused.
# The gate's L5 skips the complete pairs already in $R/gate_h200/production: with
# PROD_RESULTS=$R/gate_h200/production the five pairs of `prod_pairs` (spread over calls, the
# same machine and tree) become L5's, and `STAGES=gate GATE_ENV=RLK_GATE_L5_PAIRS=5` then runs
# L0-L4 and reports L5 over those pairs in one call.
# About 230 s for L0-L4 and 300 s for one L5 pair: it fills a call (GATE_LIMIT, default 590). Or
# in two calls: GATE_ARGS="--levels L0,L1,L2,L4 --out ..." then "--levels L5", joined by
# `python -m rlk.gate.release_gate --profile h200 --merge DIR1,DIR2 --out DIR` (same stack only).
stage gate "${GATE_LIMIT:-590}" env RLK_GATE_NO_BUILDIFIER=1 RLK_VLLM_DIR="$DEV" ${GATE_ENV:-} \
  python3 -m rlk.gate.release_gate --profile h200 --out "$R/gate_h200" ${GATE_ARGS:-}
tar czf "$OUT/results.tgz" --exclude="*_trace" -C "$R" .
cat "$SUMMARY"
