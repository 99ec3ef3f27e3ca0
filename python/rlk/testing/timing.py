"""Device timing helpers shared by the GPU benchmarks (never used by timed tests).

``cuda_graph_us(fn)``: median device time per call of ``fn`` replayed from a CUDA graph holding
``calls`` calls (warm-up on a side stream first, as the PyTorch CUDA-graphs recipe says; captured
inside :func:`rlk.kernels.common.host_validated`, so launchers read nothing back). This is the
time a graph-captured engine step pays: no host launch cost.
"""

from __future__ import annotations


def cuda_graph_us(fn, calls: int = 10, rep_ms: int = 100) -> float:
    import torch
    import triton.testing

    from rlk.kernels.common import host_validated

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), host_validated():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with host_validated(), torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return float(triton.testing.do_bench(g.replay, warmup=5, rep=rep_ms, return_mode="median")) * 1e3 / calls
