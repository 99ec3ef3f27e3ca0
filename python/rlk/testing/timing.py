"""Device timing helpers shared by the GPU benchmarks (never used by timed tests).

``cuda_graph_us(fn)``: median device time per call of ``fn`` replayed from a CUDA graph holding
``calls`` calls (warm-up on a side stream first, as the PyTorch CUDA-graphs recipe says; captured
inside :func:`rlk.kernels.common.host_validated`, so launchers read nothing back). This is the
time a graph-captured engine step pays: no host launch cost.

``back_to_back_us(fn)``: time per call of ``calls`` consecutive eager calls (one event pair around
the loop, nothing between the calls): max(host launch path, device time) per call, the rate an
eager engine sustains. ``triton.testing.do_bench`` (the default ``measure`` of
:func:`interleaved_us`) zeroes a 256 MB buffer before every timed call to flush L2; that memset
keeps the device busy (~60 us on the H200) while the host issues the timed call, so up to that
much of a call's host launch time is hidden from its do_bench time. For launch-bound ops the
back-to-back time is the honest eager figure.

``cold_graph_us(fn)``: device time per call of ``fn`` right after an L2 flush, without the host:
a CUDA graph of ``calls`` x (flush, fn) minus a graph of ``calls`` x flush, per call. It tells
whether a do_bench (eager) time above the graph time is the host launch path (then cold equals
about the graph time) or the kernel's own cold-cache latency (then cold is above it). Both arms
of a comparison pay the same inter-kernel gap after the flush.
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


def switched(fn, set_enabled, value: bool):
    """fn with one of rlk's process switches (``set_enabled(value) -> previous``, such as
    ``launcher.set_sites_enabled``) set to ``value`` for the call's duration, restored after."""
    def run():
        prev = set_enabled(value)
        try:
            return fn()
        finally:
            set_enabled(prev)
    return run


FLUSH_BYTES = 256 * 2**20  # as triton.testing.do_bench's L2 flush


def cold_graph_us(fn, calls: int = 10, flush=None, graph_us=None) -> float:
    """Per-call device time of ``fn`` after an L2 flush (see the module docstring). ``flush``
    defaults to zeroing a 256 MB buffer (do_bench's flush); ``graph_us(f, calls)`` to
    :func:`cuda_graph_us`; tests pass stand-ins."""
    if flush is None:
        import torch

        buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        flush = buf.zero_
    if graph_us is None:
        graph_us = cuda_graph_us

    def flushed():
        flush()
        return fn()

    return graph_us(flushed, calls) - graph_us(flush, calls)


def back_to_back_us(fn, calls: int = 100, sync=None, timer=None) -> float:
    """Time per call (us) of ``calls`` consecutive calls of ``fn`` after one warm-up call, with no
    cache flush or sync between them. ``sync`` / ``timer`` default to CUDA (synchronize, an event
    pair); tests pass host stand-ins."""
    import torch

    if sync is None:
        sync = torch.cuda.synchronize
    if timer is None:
        def timer():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            return lambda: (end.record(), end.synchronize(), start.elapsed_time(end) * 1e3)[-1]
    if calls < 1:
        raise ValueError(f"back_to_back_us: calls must be >= 1, got {calls}")
    fn()
    sync()
    stop = timer()
    for _ in range(calls):
        fn()
    return stop() / calls


def interleaved_us(fns: dict, rounds: int = 5, measure=None) -> dict:
    """Median over ``rounds`` of each fn's time, measured in alternation (A, B, C, A, B, C, ...).

    The H200 machine's host is noisy (the eager time of a launch-bound call swings 2-10x between
    moments), so timing one side after the other can compare a fast moment with a slow one.
    Alternating rounds give both sides the same moments. ``measure(fn) -> us`` defaults to a
    short ``triton.testing.do_bench`` median. Returns ``{name: {"us": median, "min": .., "max":
    .., "rounds": [...]}}``; a fn that raises is reported as ``{"error": repr}``.
    """
    import statistics

    import triton.testing

    if measure is None:
        def measure(fn):
            return float(triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")) * 1e3

    samples: dict = {k: [] for k in fns}
    errors: dict = {}
    for _ in range(rounds):
        for k, fn in fns.items():
            if k in errors:
                continue
            try:
                samples[k].append(measure(fn))
            except Exception as e:  # noqa: BLE001 - reported per fn, the others go on
                errors[k] = repr(e)[:300]
    out = {}
    for k, v in samples.items():
        if k in errors:
            out[k] = {"error": errors[k]}
        else:
            out[k] = {"us": statistics.median(v), "min": min(v), "max": max(v), "rounds": [round(x, 2) for x in v]}
    return out
