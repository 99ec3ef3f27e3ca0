"""Strict GEMM, contract ``gemm.bf16.v1``: ``y = x @ w.T`` (bf16 in/out, fp32 accumulate).

``launch.gemm`` is the entry point (``contract="gemm.bf16.v2"`` selects the opt-in fixed-segment
contract); ``autograd`` its differentiable ``torch.library`` op (``linear``, v1); ``contract``
holds the contracts and their split rules, ``schedule`` the checked-in tables.
"""

from rlk.kernels.gemm.contract import CONTRACT, CONTRACT_ID
from rlk.kernels.gemm.launch import gemm

__all__ = ["CONTRACT", "CONTRACT_ID", "gemm"]
