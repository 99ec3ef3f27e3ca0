"""Strict row ops: RMSNorm (+ fused residual), QK-norm, RoPE, SwiGLU, embedding.

Contracts ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1`` (``config.py``); host
entry points in ``launch.py``; autograd in ``autograd.py``; modules in ``rlk.nn.rowops``.
"""
