"""Tensor-parallel scenarios (run by ``rlk.collectives.harness``): TP=N vs TP=1 computed in the
same process with the same strict kernels (gemm.bf16.v1 under the Triton interpreter on CPU)."""

from __future__ import annotations

import torch

from rlk.collectives import reference
from rlk.collectives.scenarios import digest
from rlk.testing import assert_bitwise_equal


def _bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def tp_layers(rank: int, world: int, params: dict) -> dict:
    from rlk.nn import tensor_parallel as tp
    from rlk.kernels.gemm import autograd as G
    from rlk.kernels.rowops import autograd as rowops

    g = torch.Generator().manual_seed(11)
    M, K, N = 5, int(params.get("K", 512)), int(params.get("N", 64))
    x = _bf16(g, M, K)
    w_col = _bf16(g, 4 * N, K, scale=0.05)
    w_row = _bf16(g, N, K, scale=0.05)
    out = {}

    # Column-parallel: this rank's columns are the TP=1 columns; the gathered output is TP=1.
    col = tp.ColumnParallelLinear(w_col, gather_output=False)
    y_full = G.linear(x, w_col)
    c = y_full.shape[1] // world
    assert_bitwise_equal(col(x).detach(), y_full[:, rank * c:(rank + 1) * c], "column shard vs TP=1")
    colg = tp.ColumnParallelLinear(w_col, gather_output=True)
    assert_bitwise_equal(colg(x).detach(), y_full, "column gathered vs TP=1")

    # Row-parallel: the rank-ordered fp32 sum of the per-shard gemm partials, rounded once.
    row = tp.RowParallelLinear(w_row, input_is_parallel=False)
    y_row = row(x).detach()
    ks = K // world
    partials = [G.gemm(x[:, r * ks:(r + 1) * ks].contiguous(), w_row[:, r * ks:(r + 1) * ks].contiguous(),
                       out_fp32=True) for r in range(world)]
    assert_bitwise_equal(y_row, reference.fixed_order_sum(partials, torch.bfloat16), "row vs fixed-order reference")
    y_tp1 = G.linear(x, w_row)
    out["row_equals_tp1"] = bool(torch.equal(y_row.view(torch.int16), y_tp1.view(torch.int16)))
    out["row_predicted_equal"] = tp.row_parallel_matches_tp1(K, N, world)
    if out["row_predicted_equal"]:
        assert_bitwise_equal(y_row, y_tp1, f"row TP={world} promised equal to TP=1 (K={K}, N={N})")

    # Vocab-parallel embedding, -0.0 entries included: TP=1 bytes at every degree.
    V, H = 8 * world, 16
    emb_w = _bf16(g, V, H)
    emb_w[::3, ::2] = -0.0
    ids = torch.tensor([0, V - 1, 3, 3, V // 2, 1, V - 2], dtype=torch.int64)
    emb = tp.VocabParallelEmbedding(emb_w)
    e = emb(ids).detach()
    assert_bitwise_equal(e, rowops.embedding(ids, emb_w), "vocab-parallel embedding vs TP=1")

    # Backward through column -> row (an MLP without activation): replicated input gradient.
    xg = _bf16(g, M, 128).requires_grad_(True)
    up = tp.ColumnParallelLinear(_bf16(g, 256, 128, scale=0.05))
    down = tp.RowParallelLinear(_bf16(g, 64, 256, scale=0.05))
    y = down(up(xg))
    y.float().sum().backward()
    out.update(y=digest(y.detach()), dx=digest(xg.grad), emb=digest(e), row=digest(y_row))
    return out


def tp_cp(rank: int, world: int, params: dict) -> dict:
    """TP layers and CP attention forward in one process start (the L3 gate check)."""
    from rlk.collectives.cp_scenarios import cp_attention

    return {"tp": tp_layers(rank, world, params), "cp": cp_attention(rank, world, {"lens": [32, 16], "backward": False})}
