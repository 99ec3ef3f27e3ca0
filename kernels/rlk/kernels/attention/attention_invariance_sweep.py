"""Measured invariance matrix of ``attn.v2``'s launch axes on the GPU (H200).

    python -m rlk.kernels.attention.attention_invariance_sweep --out sweep.json [--quick]

Baseline: ``prefill`` with the checked-in sm90 table. Each row varies one launch axis
(BLOCK_M, num_warps, num_stages, GQA packing GP, page size, chunk size, split vs in-register
fold) and counts elements of out/LSE that differ from the baseline for the same rows. Axes with
0 differing elements are bit-neutral on this machine and toolchain; anything else must become a
contract field (or the kernel must change). Shapes: Qwen3-8B TP4 heads (8 / 2), head_dim 128.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch


def _diff(a, b):
    a32, b32 = a.float(), b.float()
    neq = a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32) != b.view(
        torch.int16 if b.dtype == torch.bfloat16 else torch.int32)
    fin = torch.isfinite(a32) & torch.isfinite(b32)
    mad = float((a32 - b32)[fin].abs().max()) if bool(fin.any()) else 0.0
    return int(neq.sum()), mad


def main(argv=None):
    from rlk.kernels.attention import launch, schedule
    from rlk.kernels.attention import testing as T

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hq", type=int, default=8)
    ap.add_argument("--hk", type=int, default=2)
    a = ap.parse_args(argv)
    lens = [1, 17, 64, 65, 511, 513, 1100] if a.quick else [1, 17, 63, 64, 65, 511, 512, 513, 1100, 2049, 4100]
    q, k, v, cu = T.packed(lens, a.hq, a.hk, 128, device="cuda", seed=0)
    scale = 128 ** -0.5
    out, lse = launch.prefill(q, k, v, cu, max(lens), scale)
    cu_l = cu.tolist()
    dec_rows = sorted({r for b in range(len(lens)) for r in (cu_l[b], cu_l[b + 1] - 1, (cu_l[b] + cu_l[b + 1]) // 2)})
    rows = []

    def record(kernel, axis, value, o, l, idx=None):
        ro, rl = (out, lse) if idx is None else (out[idx], lse[idx])
        n_o, mad_o = _diff(o, ro)
        n_l, mad_l = _diff(l, rl)
        rows.append({"kernel": kernel, "axis": axis, "value": value, "out_differing": n_o,
                     "lse_differing": n_l, "out_max_abs_diff": mad_o, "lse_max_abs_diff": mad_l,
                     "elements": o.numel()})
        print(f"{kernel:8} {axis:28} {str(value):28} out_diff={n_o:<8} lse_diff={n_l:<8}")

    def safe(kernel, axis, value, fn, idx=None):
        try:
            o, l = fn()
            record(kernel, axis, value, o, l, idx)
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result too
            rows.append({"kernel": kernel, "axis": axis, "value": value, "error": repr(e)[:300]})
            print(f"{kernel:8} {axis:28} {str(value):28} ERROR {repr(e)[:80]}")

    bms = (16, 64, 128) if a.quick else (16, 32, 64, 128)
    for bm, nw, gp in itertools.product(bms, (4, 8), (1, a.hq // a.hk)):
        if gp > bm:
            continue
        with schedule.override("prefill", BLOCK_M=bm, num_warps=nw, GP=gp):
            safe("prefill", "BLOCK_M/num_warps/GP", [bm, nw, gp],
                 lambda: launch.prefill(q, k, v, cu, max(lens), scale))
    for ns in (1, 2, 3, 4):
        with schedule.override("prefill", num_stages=ns):
            safe("prefill", "num_stages", ns, lambda: launch.prefill(q, k, v, cu, max(lens), scale))
    for page in (16, 64, 256):
        kc, vc, bt = T.paged_cache(k, v, cu, page, seed=page)
        for bm, nw in itertools.product((16, 32, 64), (2, 4, 8)):
            with schedule.override("paged_decode", BLOCK_M=bm, num_warps=nw):
                safe("decode", "page/BLOCK_M/num_warps", [page, bm, nw],
                     lambda: T.decode_rows(q, cu, kc, vc, bt, dec_rows, scale), dec_rows)
        for chunk in ((1, 512) if a.quick else (1, 37, 512, 2048)):
            for bm in (16, 64, 128):
                with schedule.override("paged_chunk", BLOCK_M=bm):
                    safe("chunked", "page/chunk/BLOCK_M", [page, chunk, bm],
                         lambda: T.chunked_prefill(q, cu, kc, vc, bt, chunk, scale))
    # Split-KV decode vs in-register fold of the same rows: capacity of one segment or more.
    kc, vc, bt = T.paged_cache(k, v, cu, 64, seed=1, capacity_pages=64)
    safe("decode", "split (capacity 4096)", True, lambda: T.decode_rows(q, cu, kc, vc, bt, dec_rows, scale), dec_rows)
    safe("decode", "no split (chunk path, q_len=1)", False,
         lambda: T.decode_rows(q, cu, kc, vc, bt, dec_rows, scale, max_seqlen_q=2, validate=False), dec_rows)
    bad = [r for r in rows if r.get("out_differing") or r.get("lse_differing") or "error" in r]
    print(f"{len(rows)} configurations, {len(bad)} differing or failing")
    try:
        from rlk import provenance

        prov = provenance.capability_record(contract_ids=["attn.v2"])
    except Exception:  # noqa: BLE001
        import triton

        prov = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
    with open(a.out, "w") as f:
        json.dump({"provenance": prov, "baseline": schedule.schedule("prefill", q.device), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
