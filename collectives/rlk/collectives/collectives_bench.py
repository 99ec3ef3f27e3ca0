"""Latency of the fixed-order collectives vs NCCL (GPU only; not a test, not run in CI).

Launch one process per GPU, for example on 8 GPUs::

    torchrun --nproc-per-node 8 -m rlk.collectives.collectives_bench --out collectives_h200.json [--quick]

Per op and message size (4 KiB..16 MiB of bf16):
``strict_us`` = median of CUDA-event timings of ``rlk.collectives`` (ar.v1 / rs.v1 / ag.v1, the
torch.distributed transport: byte all-gather/all-to-all + local rank-ordered fold), ``nccl_us``
= the same for ``dist.all_reduce`` / ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` on
the same tensors; max over ranks of each median. ``all_reduce_oneshot``: ar.v1 through the
single-node one-shot transport (``rlk.collectives.ipc``, symmetric memory) vs the same NCCL call. Rank 0 prints a table and writes JSON
``{"provenance": ..., "rows": [{op, world_size, bytes, strict_us, nccl_us, ratio}]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def _provenance():
    import torch

    try:
        from rlk.provenance import capability_record

        return capability_record()
    except Exception:  # noqa: BLE001 - provenance module may not exist yet
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _time_us(fn, iters: int, warmup: int = 10) -> float:
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from rlk import collectives as C

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    n, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", local)
    sg = C.StrictGroup(check_every_call=False)
    sg.verify(dev)
    sizes = [4 << 10, 1 << 20, 16 << 20] if a.quick else [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20,
                                                         4 << 20, 16 << 20]
    from rlk.collectives.ipc import OneShotAllReduce

    oneshot = OneShotAllReduce(max(sizes) // 2, torch.bfloat16, device=dev)
    rows = []
    for nbytes in sizes:
        numel = max(n, nbytes // 2 // n * n)
        x = torch.randn(numel, device=dev).to(torch.bfloat16)
        shard = torch.empty(numel // n, dtype=torch.bfloat16, device=dev)
        full = torch.empty(numel * n, dtype=torch.bfloat16, device=dev)
        cases = {
            "all_reduce": (lambda: C.all_reduce(x, sg), lambda: dist.all_reduce(x.clone())),
            "reduce_scatter": (lambda: C.reduce_scatter(x, sg), lambda: dist.reduce_scatter_tensor(shard, x)),
            "all_gather": (lambda: C.all_gather(x, sg), lambda: dist.all_gather_into_tensor(full, x)),
            # the single-node one-shot transport (rlk.collectives.ipc): same ar.v1 bytes
            "all_reduce_oneshot": (lambda: oneshot(x), lambda: dist.all_reduce(x.clone())),
        }
        for op, (strict, nccl) in cases.items():
            s_us, n_us = _time_us(strict, a.iters), _time_us(nccl, a.iters)
            t = torch.tensor([s_us, n_us], device=dev, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # timing only (not a strict path)
            s_us, n_us = t.tolist()
            rows.append({"op": op, "world_size": n, "bytes": numel * 2, "strict_us": round(s_us, 2),
                         "nccl_us": round(n_us, 2), "ratio": round(s_us / n_us, 3)})
    if rank == 0:
        print(f"{'op':16} {'ws':>3} {'bytes':>10} {'strict_us':>10} {'nccl_us':>10} {'ratio':>7}")
        for r in rows:
            print(f"{r['op']:16} {r['world_size']:>3} {r['bytes']:>10} {r['strict_us']:>10} {r['nccl_us']:>10} {r['ratio']:>7}")
        with open(a.out, "w") as f:
            json.dump({"provenance": _provenance(), "transport": "torch.distributed (nccl) bytes + local fold",
                       "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
