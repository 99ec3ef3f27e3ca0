"""Strict attention (contract ``attn.v2``): varlen prefill, chunked prefill and paged decode
that give byte-identical rows, an exact KV-cache write, and a deterministic backward.

Entry points live in :mod:`rlk.kernels.attention.launch` (``prefill``, ``paged``, ``write_kv``,
``backward``), the trainer's differentiable op in :mod:`rlk.kernels.attention.autograd`
(``varlen_attention``); importing this package registers the contract (``config``)."""

from rlk.kernels.attention import config  # noqa: F401  (registers attn.v2)
