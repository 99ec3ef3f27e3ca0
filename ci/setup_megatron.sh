#!/usr/bin/env bash
# Installs the pinned megatron-core into the project venv (.venv) for the megatron integration
# tests (integrations/rlk/integrations/megatron). Run after ci/bootstrap.sh. Idempotent: does
# nothing when the pinned version already imports.
#
#   bash ci/setup_megatron.sh                     # CI / developers (Python 3.11, CPU)
#   RLK_MEGATRON_WHEEL=/path/megatron_core-0.19.2-cp312-...whl bash ci/setup_megatron.sh
#                                                 # a carried wheel (the H200 has no registry)
#
# Pins and why:
#   megatron-core==0.19.2  the version the integration's adapters are written against (layer-
#       spec signatures, output_processor hook of GPTModel._postprocess; ../shared/ENGINES.md).
#       It declares Requires-Python >= 3.12; its cp311 wheel installs and imports on the CI's
#       Python 3.11 (../shared/STACK.md), hence --ignore-requires-python. The cp311 wheel is
#       hash-pinned below (sha256 of the PyPI file).
#   --no-deps  megatron-core's import-time requirements are numpy, packaging and torch, all
#       already pinned (hash-locked) in third_party/requirements.lock by ci/bootstrap.sh: nothing
#       else is installed, so no resolver can replace them.
#   torch==2.13.0 (constraint)  guards against any pip path pulling a different (CUDA) torch.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${RLK_VENV_PYTHON:-$ROOT/.venv/bin/python}
VERSION=0.19.2
CP311_SHA256=3be561cb9c4789e062a43147d3e8632b0750e1f9bbf7aa9f5d8d518b1205951b
log() { echo "setup_megatron: $*" >&2; }

[ -x "$PY" ] || { log "no venv python at $PY (run ci/bootstrap.sh first)"; exit 1; }

# The distribution's version (the module's __version__ carries a build suffix: 0.19.2+3f27b13).
version_of() { "$PY" -W ignore -c 'import importlib.metadata as md, megatron.core; print(md.version("megatron-core"))' 2>/dev/null; }
have=$(version_of || true)
if [ "$have" = "$VERSION" ]; then
  log "megatron-core $VERSION present"
  exit 0
fi

mkdir -p .cache
CONSTRAINT=.cache/megatron-constraints.txt
echo "torch==2.13.0" > "$CONSTRAINT"
if "$PY" -c 'import torch,sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then :; else
  # The H200 machine runs torch 2.11; --no-deps means torch is never touched, the constraint
  # file only documents the CI pin there.
  log "note: torch is $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing) here (CI pins 2.13.0)"
  : > "$CONSTRAINT"
fi
PIP=("$PY" -m pip --disable-pip-version-check install -q --no-deps --ignore-requires-python -c "$CONSTRAINT")
pytag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

if [ -n "${RLK_MEGATRON_WHEEL:-}" ]; then
  log "installing the carried wheel $RLK_MEGATRON_WHEEL"
  "${PIP[@]}" "$RLK_MEGATRON_WHEEL"
elif [ "$pytag" = cp311 ]; then
  REQ=.cache/megatron-requirements.txt
  printf 'megatron-core==%s --hash=sha256:%s\n' "$VERSION" "$CP311_SHA256" > "$REQ"
  log "installing megatron-core $VERSION ($pytag, hash-pinned)"
  "${PIP[@]}" --require-hashes -r "$REQ" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
else
  log "installing megatron-core $VERSION for $pytag (no pinned hash for this tag)"
  "${PIP[@]}" "megatron-core==$VERSION" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi

got=$(version_of || true)
[ "$got" = "$VERSION" ] || { log "import gives megatron-core $got, want $VERSION"; exit 1; }
log "megatron-core $got installed and imports"
