#!/usr/bin/env bash
# vLLM 0.26.0 for the H200 machine, which has torch/triton but no vLLM and no registry, and
# accepts at most 64 MiB of files per call: a pinned, hash-checked bundle (one part of ~41 MiB
# once pruned; several if PART_MIB is smaller).
#
#   bash ci/vllm_bundle.sh build          # CPU machine: download, verify, install, prune, pack
#   PART_MIB=N bash ci/vllm_bundle.sh split  # re-split the packed bundle into parts of N MiB
#   bash ci/vllm_bundle.sh stage1         # device, several parts only: keep part 1 in $RLK_VLLM_DIR
#   bash ci/vllm_bundle.sh stage2         # device, the call that runs vLLM (after stage1's, same machine,
#                                         #   if several parts): reassemble, verify sha256, extract,
#                                         #   register rlk's plugin
#   eval "$(bash ci/vllm_bundle.sh env)"  # device: PYTHONPATH and the variables vLLM needs there
#
# Pins: third_party/vllm_h200/wheels.lock (name, version, sha256, file of every wheel the device
# lacks: vLLM 0.26.0, its runtime packages, megatron-core 0.19.2). 0.26.0 is the newest vLLM whose
# CUDA wheel pins the device's torch 2.11.0 (cu130). What a dense model on sm_90 never loads is
# removed before packing (FA2's sm80 library, the MoE library, the Rust frontend, SM100 sources,
# deep_gemm builds for other Pythons; in every library, the device code an sm_90 GPU never loads,
# zeroed in place by ci/fatbin_prune.py). The packed tarball is split into parts of $PART_MIB MiB in
# .vllm_bundle/ (ignored by git); .vllm_bundle/manifest.json records every sha256.
# Device calls carry .vllm_bundle/manifest.json plus one part each (`carry` of the device tool).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=$ROOT/third_party/vllm_h200/wheels.lock
BUNDLE=$ROOT/.vllm_bundle
CACHE=${RLK_VLLM_WHEEL_CACHE:-$ROOT/.cache/vllm_h200}
DEV=${RLK_VLLM_DIR:-/tmp/rlk_vllm}
PART_MIB=${PART_MIB:-41}  # the pruned tarball fits one part: one call carries it with the tree
log() { echo "vllm_bundle: $*" >&2; }

# The device's interpreter (CPython 3.12, x86-64 glibc); pip picks cp312 / abi3 / pure wheels for it.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --ignore-requires-python --platform any)
for n in 1 2014 2_17 2_24 2_26 2_27 2_28 2_31; do
  case $n in 1|2014) TARGET+=(--platform "manylinux${n}_x86_64") ;; *) TARGET+=(--platform "manylinux_${n}_x86_64") ;; esac
done

lock_rows() { grep -v '^#' "$LOCK" | grep -v '^[[:space:]]*$'; }

build() {
  local t0=$SECONDS wheels=$CACHE/wheels site=$CACHE/site
  mkdir -p "$wheels" "$BUNDLE"
  log "1/4 wheels (pinned in $(basename "$LOCK"), sha256-checked) -> $wheels"
  while read -r name ver sha file; do
    if [ ! -f "$wheels/$file" ] || [ "$(sha256sum "$wheels/$file" | cut -c1-64)" != "$sha" ]; then
      python3 -m pip download -q --no-deps "${TARGET[@]}" -d "$wheels" "$name==$ver" \
        2> >(grep -v "is ignored: it is neither" >&2)
    fi
    got=$(sha256sum "$wheels/$file" | cut -c1-64)
    [ "$got" = "$sha" ] || { log "sha256 mismatch for $file: $got (lock: $sha)"; exit 1; }
  done < <(lock_rows)
  log "2/4 install --no-deps --target (cp312 manylinux) ... ($((SECONDS - t0)) s)"
  rm -rf "$site"
  local files=()
  while read -r name ver sha file; do files+=("$wheels/$file"); done < <(lock_rows)
  python3 -m pip install -q --no-deps --no-compile "${TARGET[@]}" --target "$site" "${files[@]}" \
    2> >(grep -v "is ignored: it is neither" >&2)
  log "3/4 prune what a dense model on sm_90 never loads"
  rm -f "$site"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$site"/vllm/_moe_C*.so
  rm -rf "$site"/vllm/vllm-rs "$site"/vllm/third_party/fmha_sm100 "$site"/bin
  find "$site"/vllm/third_party/deep_gemm -name '_C.cpython-*.so' ! -name '*cpython-312*' -delete 2>/dev/null || true
  find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
  # Device code an sm_90 GPU never loads (other architectures' cubins, PTX where an sm_90 cubin
  # exists): payloads zeroed in place, layout and kept images byte-identical (ci/fatbin_prune.py).
  find "$site" -name '*.so' -print0 | xargs -0 python3 "$ROOT/ci/fatbin_prune.py" --keep-arch 90 \
    > "$CACHE/fatbin_prune.jsonl"  # summed into manifest.json's fatbin_prune by split_parts
  log "4/4 pack (tar | xz -9, deterministic order and times) ... ($((SECONDS - t0)) s)"
  rm -f "$BUNDLE"/part-* "$BUNDLE"/bundle.tar.xz
  tar -C "$site" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . \
    | xz -9 -T2 > "$BUNDLE/bundle.tar.xz"
  split_parts
  log "done in $((SECONDS - t0)) s: $(ls "$BUNDLE")"
}

# Splits .vllm_bundle/bundle.tar.xz (or the existing parts, joined) into $PART_MIB MiB parts and
# writes manifest.json.
split_parts() {
  local site=$CACHE/site
  if [ ! -f "$BUNDLE/bundle.tar.xz" ]; then cat "$BUNDLE"/part-* > "$BUNDLE/bundle.tar.xz"; fi
  rm -f "$BUNDLE"/part-*
  (cd "$BUNDLE" && split -b "${PART_MIB}M" -a 2 bundle.tar.xz part- && rm bundle.tar.xz)
  python3 - "$BUNDLE" "$LOCK" "$site" <<'EOF'
import hashlib, json, os, sys
b, lock, site = sys.argv[1:4]
parts = sorted(p for p in os.listdir(b) if p.startswith("part-"))
h = hashlib.sha256()
rec = {"parts": []}
for p in parts:
    data = open(os.path.join(b, p), "rb").read()
    h.update(data)
    rec["parts"].append({"name": p, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
rec["bundle_sha256"] = h.hexdigest()
rec["bundle_bytes"] = sum(p["bytes"] for p in rec["parts"])
rec["wheels_lock_sha256"] = hashlib.sha256(open(lock, "rb").read()).hexdigest()
rec["extracted_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(site) for f in fs)
rec["vllm"] = "0.26.0"
pruned = os.path.join(os.path.dirname(site), "fatbin_prune.jsonl")
if os.path.exists(pruned):
    rows = [json.loads(l) for l in open(pruned)]
    rec["fatbin_prune"] = {"keep_arch": 90, "libraries": sum(1 for r in rows if r.get("zeroed")),
                           "zeroed_entries": sum(r.get("zeroed", 0) for r in rows),
                           "zeroed_bytes": sum(r.get("zeroed_bytes", 0) for r in rows)}
json.dump(rec, open(os.path.join(b, "manifest.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in rec.items() if k != "parts"}), [(p["name"], p["bytes"]) for p in rec["parts"]])
EOF
}

manifest_field() { python3 -c "import json,sys; print(json.load(open('$BUNDLE/manifest.json'))$1)"; }

stage1() {
  mkdir -p "$DEV"
  local first
  first=$(manifest_field '["parts"][0]["name"]')
  [ -f "$BUNDLE/$first" ] || { log "carry .vllm_bundle/$first in this call"; exit 1; }
  cp "$BUNDLE/$first" "$BUNDLE/manifest.json" "$DEV/"
  log "staged $first in $DEV (the next call must come while this machine is still warm)"
}

stage2() {
  mkdir -p "$DEV"
  local want parts p
  want=$(manifest_field '["bundle_sha256"]')
  if [ -f "$DEV/site/.rlk_bundle_sha256" ] && [ "$(cat "$DEV/site/.rlk_bundle_sha256")" = "$want" ]; then
    log "already extracted in $DEV/site"; return 0
  fi
  parts=$(manifest_field '["parts"]' | python3 -c "import ast,sys; print(' '.join(p['name'] for p in ast.literal_eval(sys.stdin.read())))")
  for p in $parts; do
    [ -f "$DEV/$p" ] || { [ -f "$BUNDLE/$p" ] && cp "$BUNDLE/$p" "$DEV/"; }
    [ -f "$DEV/$p" ] || { log "part $p is neither staged in $DEV nor carried (run stage1 in the call before)"; exit 1; }
  done
  local got
  got=$(cd "$DEV" && cat $parts | sha256sum | cut -c1-64)
  [ "$got" = "$want" ] || { log "bundle sha256 $got != manifest $want"; exit 1; }
  rm -rf "$DEV/site" && mkdir -p "$DEV/site"
  if command -v xz >/dev/null; then
    (cd "$DEV" && cat $parts) | xz -d -T0 | tar -C "$DEV/site" -xf -
  else  # no xz binary: Python's lzma
    (cd "$DEV" && cat $parts) | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
      | tar -C "$DEV/site" -xf -
  fi
  # rlk's vLLM plugin entry point (vLLM finds plugins through installed distributions' metadata).
  local di=$DEV/site/rlk_plugin-0.1.0.dist-info
  mkdir -p "$di"
  printf 'Metadata-Version: 2.1\nName: rlk-plugin\nVersion: 0.1.0\n' > "$di/METADATA"
  printf '[vllm.general_plugins]\nrlk = rlk.integrations.vllm.plugin:register\n' > "$di/entry_points.txt"
  echo "$want" > "$DEV/site/.rlk_bundle_sha256"
  log "extracted $(du -sh "$DEV/site" | cut -f1) into $DEV/site (sha256 $want)"
}

env_lines() {
  echo "export PYTHONPATH=$ROOT/python:$ROOT/kernels:$ROOT/collectives:$ROOT/integrations:$DEV/site\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export RLK_VLLM_BUNDLE_SHA256=$(cat "$DEV/site/.rlk_bundle_sha256" 2>/dev/null || echo missing)"
  echo "export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
}

case "${1:-}" in
  build) build ;;
  split) split_parts ;;
  stage1) stage1 ;;
  stage2) stage2 ;;
  env) env_lines ;;
  *) echo "usage: $0 build|stage1|stage2|env" >&2; exit 2 ;;
esac
