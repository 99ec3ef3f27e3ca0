"""CP-local-row attention scenario (run by ``rlk.collectives.harness``): CP=N rows vs CP=1
``prefill`` rows computed in the same process with the strict attention kernel (interpreter)."""

from __future__ import annotations

import torch

from rlk.collectives.scenarios import digest
from rlk.testing import assert_bitwise_equal


def cp_attention(rank: int, world: int, params: dict) -> dict:
    from rlk.kernels.attention import launch
    from rlk.nn import context_parallel as cpm

    g = torch.Generator().manual_seed(5)
    lens = params.get("lens", [32, 16])
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    T, hq, hk, d = cu[-1], 2, 1, int(params.get("head_dim", 16))
    q, k, v = (torch.randn(T, h, d, generator=g).to(torch.bfloat16) for h in (hq, hk, hk))
    do = torch.randn(T, hq, d, generator=g).to(torch.bfloat16)
    scale = d ** -0.5
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out1, lse1 = launch.prefill(q, k, v, cu_t, max(lens), scale)

    split = [cpm.zigzag_split(x, cu, world, rank) for x in (q, k, v)]
    ql, kl, vl = (x.clone().requires_grad_(True) for x in split)
    out, lse = cpm.cp_local_row_attention(ql, kl, vl, cu, scale)
    pos = cpm.zigzag_positions(cu, world, rank)
    assert_bitwise_equal(out.detach(), out1[pos], f"CP={world} out rows vs CP=1")
    assert_bitwise_equal(lse.detach(), lse1[pos], f"CP={world} lse rows vs CP=1")
    res = {"rows": int(pos.numel())}
    if params.get("backward", True):
        out.backward(cpm.zigzag_split(do, cu, world, rank))
        dq1, dk1, dv1 = launch.backward(do, q, k, v, out1, lse1, cu_t, max(lens), scale)
        res["dq_equals_cp1"] = bool(torch.equal(ql.grad.view(torch.int16), dq1[pos].view(torch.int16)))
        res["dk_equals_cp1"] = bool(torch.equal(kl.grad.view(torch.int16), dk1[pos].view(torch.int16)))
        # dK/dV rows are disjoint per rank: gather them to compare the full tensor across ranks.
        from rlk import collectives as C

        res["dk"] = digest(C.all_gather(kl.grad.contiguous()))
        res["dv"] = digest(C.all_gather(vl.grad.contiguous()))
        res["dq"] = digest(C.all_gather(ql.grad.contiguous()))
    return res
