"""Test-session setup, applied before any kernel module is imported.

Without a CUDA device the Triton CPU interpreter is switched on (it must be set before the
``@triton.jit`` decorators run). Tests marked ``gpu`` are skipped with a reason when no NVIDIA
GPU is present, and tests marked ``multigpu`` (Bazel tag requires-gpu-nvidia:2) when fewer than
two are visible: a skip is never counted as coverage.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
for _r in ("python", "kernels", "collectives", "integrations"):
    _p = os.path.join(_ROOT, _r)
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from rlk import determinism  # noqa: E402

if not torch.cuda.is_available():
    determinism.configure_cpu_interpreter()

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (requires-gpu-nvidia): not run here, not verified")
    multi = pytest.mark.skip(reason=f"needs 2+ NVIDIA GPUs (requires-gpu-nvidia:2), {n} visible: not run "
                                    "here, not verified")
    for item in items:
        if "gpu" in item.keywords and n == 0:
            item.add_marker(gpu)
        elif "multigpu" in item.keywords and n < 2:
            item.add_marker(multi)
