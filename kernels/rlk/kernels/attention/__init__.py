"""Strict attention (contract ``attn.v2``): varlen prefill, chunked prefill and paged decode
that give byte-identical rows, an exact KV-cache write, and a deterministic backward.

Entry points live in :mod:`rlk.kernels.attention.launch` (``prefill``, ``paged``, ``write_kv``,
``backward``), the trainer's differentiable op in :mod:`rlk.kernels.attention.autograd`
(``varlen_attention``); the contract in ``contract.py``, the schedule tables in ``schedule.py``.
Importing this package registers the contract and its kernels."""

from rlk.kernels.attention import contract, schedule  # noqa: F401  (register attn.v2 and its kernels)

