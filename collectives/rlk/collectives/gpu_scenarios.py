"""NCCL scenarios (one GPU per rank; run by ``rlk.collectives.harness`` with backend="nccl")."""

from __future__ import annotations

import torch

from rlk import collectives as C
from rlk.collectives import reference
from rlk.collectives.scenarios import digest, order_sensitive_input
from rlk.testing import assert_bitwise_equal


def nccl_bitwise(rank: int, world: int, params: dict) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    sg = C.StrictGroup(check_every_call=bool(params.get("check_every_call", False)))
    sg.verify(dev)
    rows = []
    for dname, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for numel in params["sizes"]:
            inputs = [order_sensitive_input(0, r, numel, dtype) for r in range(world)]
            ar = C.all_reduce(inputs[rank].to(dev), sg)
            assert_bitwise_equal(ar.cpu(), reference.fixed_order_sum(inputs), f"nccl all_reduce {dname} n={numel}")
            m = -(-numel // world)
            padded = [torch.cat([x, x.new_zeros(m * world - numel)]) for x in inputs]
            rs = C.reduce_scatter(padded[rank].to(dev), sg)
            assert_bitwise_equal(rs.cpu(), reference.reduce_scatter(padded)[rank], f"nccl reduce_scatter {dname}")
            ag = C.all_gather(inputs[rank].to(dev).view(numel, 1), sg)
            assert_bitwise_equal(ag.cpu(), reference.all_gather([x.view(numel, 1) for x in inputs]), "nccl all_gather")
            rows.append({"dtype": dname, "numel": numel, "ar": digest(ar), "ag": digest(ag)})
    return {"rows": rows}


def oneshot_bitwise(rank: int, world: int, params: dict) -> dict:
    """The single-node one-shot transport (rlk.collectives.ipc): every size and dtype bitwise equal
    to the reference and to the NCCL transport's all_reduce, on every rank; twice in a row per
    size (slot reuse), and a captured call replayed twice from a CUDA graph."""
    from rlk.collectives.ipc import OneShotAllReduce

    dev = torch.device("cuda", torch.cuda.current_device())
    sizes = params["sizes"]
    rows = []
    for dname, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        ar1 = OneShotAllReduce(max(sizes), dtype, device=dev)
        for numel in sizes:
            inputs = [order_sensitive_input(0, r, numel, dtype) for r in range(world)]
            ref = reference.fixed_order_sum(inputs)
            for _ in range(2):
                got = ar1(inputs[rank].to(dev))
                assert_bitwise_equal(got.cpu(), ref, f"one-shot {dname} n={numel}")
            assert_bitwise_equal(got, C.all_reduce(inputs[rank].to(dev)), f"one-shot vs nccl transport {dname}")
            rows.append({"dtype": dname, "numel": numel, "ar": digest(got)})
        x = inputs[rank].to(dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = ar1(x)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(y.cpu(), ref, f"one-shot in a CUDA graph {dname}")
    return {"rows": rows}
