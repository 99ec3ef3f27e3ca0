"""Strict row ops: RMSNorm (+ fused residual), QK-norm, RoPE, SwiGLU, embedding.

Contracts ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1`` (``contract.py``); config
tables (``schedule.py``); host entry points in ``launch.py``; autograd in ``autograd.py``.
Importing this package registers the contracts and the kernels.
"""

from rlk.kernels.rowops import contract  # noqa: F401  (registers the row-op contracts)
