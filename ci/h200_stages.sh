# Sourced by the device scripts (ci/h200_check.sh, ci/h200_vllm.sh): one stage runner.
#
#   stage NAME LIMIT_S CMD...
#
# Runs CMD when NAME is in $STAGES, with a time limit, its output in $R/NAME.log; appends
# "NAME rc=.. Ns" to $SUMMARY, prints the log's last $STAGE_TAIL lines, and refreshes
# $OUT/results.tgz (all of $R but $STAGE_EXCLUDE) after every stage, so a call that runs out of
# time still brings back what it finished. A failing stage does not stop the script.
# Sourcing it also unpacks a CUTLASS library carried packed (see the end of this file), so both
# device scripts find it in build/sm90 before their first stage.
stage() {
  local name=$1 limit=$2; shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*"
  timeout --kill-after=15 "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$SUMMARY"
  tail -n "${STAGE_TAIL:-25}" "$R/$name.log"
  tar czf "$OUT/results.tgz" --exclude="${STAGE_EXCLUDE:-*.safetensors}" -C "$R" .
}

# A CUTLASS library carried packed (`python -m rlk.kernels.gemm.sm90 pack`: build/sm90_carry, a
# tenth of the library's size) is unpacked into build/sm90, sha256-checked, before any stage.
if [ -f build/sm90_carry/librlk_gemm_sm90.so.xz ]; then
  PYTHONPATH=$PWD/python:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH} python3 -m rlk.kernels.gemm.sm90 unpack \
    --src build/sm90_carry --out build/sm90 \
    || echo "sm90 unpack failed: stages run without the carried library"
fi
