#!/usr/bin/env bash
# Regenerates third_party/requirements.lock (hash-locked) from third_party/requirements.in.
#
#   bash ci/lock_requirements.sh
#
# Uses pip-tools in a throwaway venv under .cache/. torch is the CPU build (2.13.0+cpu): pip
# finds it in /opt/wheels on the CI machines (RLK_TORCH_FIND_LINKS overrides); its hash is
# that file's. Elsewhere set RLK_TORCH_FIND_LINKS=https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
FIND_LINKS=${RLK_TORCH_FIND_LINKS:-/opt/wheels}
TOOLS=.cache/pip-tools
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --upgrade pip pip-tools==7.6.2
fi
cd third_party
# The machine-wide pip constraint file (if any) must not shape the lock.
PIP_CONSTRAINT= "../$TOOLS/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-find-links --no-emit-index-url --find-links "$FIND_LINKS" \
  --output-file requirements.lock requirements.in
echo "wrote third_party/requirements.lock ($(grep -c -- '--hash=sha256:' requirements.lock) hashes)"
