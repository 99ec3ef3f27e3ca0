"""Bazel main of `//integrations/rlk/integrations/vllm:vllm_test`.

vLLM is not in rlk's main lock: its tests run in the separate `.venv-vllm` that
`ci/setup_vllm.sh` builds (ci/bootstrap.sh runs it). Bazel 4 starts this file with the main
`.venv`'s python3; it re-runs pytest over this package's tests with `.venv-vllm/bin/python` from
the real checkout (found through the runfiles symlink of this file), writes JUnit XML where
Bazel reads it, and returns pytest's exit status. A missing `.venv-vllm` is a failure, never a
skip.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    here = os.path.dirname(os.path.realpath(__file__))  # the checkout, not the runfiles tree
    root = os.path.abspath(os.path.join(here, "..", "..", "..", ".."))
    py = os.path.join(root, ".venv-vllm", "bin", "python")
    if not os.path.exists(py):
        print(f"vllm_test: {py} missing: run `bash ci/setup_vllm.sh` (ci/bootstrap.sh does)", flush=True)
        return 1
    env = dict(os.environ)
    tmp = env.get("TEST_TMPDIR")
    if tmp:
        env.setdefault("HOME", tmp)
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton-cache")
        env["VLLM_CACHE_ROOT"] = os.path.join(tmp, "vllm-cache")
    env["CI"] = env.get("CI") or "1"  # engine tests fail (not skip) without vLLM
    env.pop("PYTHONPATH", None)  # .venv-vllm imports rlk from its own editable install
    args = [py, "-m", "pytest", here, "-q", "-p", "no:cacheprovider", "-rs"]
    xml = env.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    return subprocess.call(args, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
