"""Which launch axes of gemm.bf16.v1 are bit-neutral on this GPU? (GPU script, not a test.)

For each shape, the reference is the default prefill schedule at M = 4096. Every swept
configuration (schedule, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) computes M rows and
is compared bytewise (fp32 output: the accumulation itself; bf16 output: after the rounding)
against the reference's first M rows. The MMA form of each compiled kernel (wgmma / mma.sync) is
read from its PTX. The matrix is written as JSON (kept next to the contract as
``configs/invariance_sm90.json``):

  python -m rlk.kernels.gemm.gemm_invariance_sweep --out invariance_sm90.json [--full]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

from rlk.testing.shapes import QWEN3_8B_GEMMS

REF_M = 4096


def _configs(full: bool):
    bm_d, bn_d = ((16, 32, 64), (16, 32, 64, 128)) if full else ((16, 64), (16, 64, 128))
    bm_p, bn_p = ((32, 64, 128), (32, 64, 128, 256)) if full else ((64, 128), (64, 128, 256))
    stages = (2, 3, 4) if full else (3,)
    for bm, bn, bk, nw, ns in itertools.product(bm_d, bn_d, (64, 128), (4, 8), (4,) + ((2, 3) if full else ())):
        yield "decode", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
    for ns in (2, 4):
        yield "decode", dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=ns)
    for bm, bn, bk, nw, ns in itertools.product(bm_p, bn_p, (64, 128), (4, 8), stages):
        yield "prefill", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=ns)
    for ns in (2, 4):
        yield "prefill", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=1, num_warps=8, num_stages=ns)


def _mma_form(handles) -> str:
    forms = set()
    for h in handles:
        try:
            ptx = h.asm["ptx"]
        except Exception:  # noqa: BLE001
            continue
        if "wgmma" in ptx:
            forms.add("wgmma")
        if "mma.sync" in ptx:
            forms.add("mma.sync")
    return "+".join(sorted(forms)) or "unknown"


def _ndiff(a, b) -> int:
    iv = torch.int32 if a.dtype == torch.float32 else torch.int16
    return int((a.view(iv) != b.view(iv)).sum().item())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="gemm.bf16.v1 bit-neutrality sweep")
    ap.add_argument("--out", required=True)
    ap.add_argument("--full", action="store_true", help="more block sizes and stages (slower)")
    ap.add_argument("--shapes", default="qkv,tp4_lm_head", help="names from QWEN3_8B_GEMMS")
    ap.add_argument("--m", default="1,7,64,300")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU", file=sys.stderr)
        return 2
    from rlk.errors import UnsupportedConfigError
    from rlk.kernels.gemm import contract, launch

    m_list = [int(v) for v in args.m.split(",")]
    rows, t0 = [], time.time()
    for name in args.shapes.split(","):
        K, N = QWEN3_8B_GEMMS[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(REF_M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = {dt: launch.gemm(x, w, out_dtype=dt, schedule="prefill") for dt in (torch.float32, torch.bfloat16)}
        ref_plan = launch.plan(REF_M, K, N, x.device, "prefill")
        for schedule, cfg in _configs(args.full):
            row = {"shape": name, "K": K, "N": N, "split_k": contract.split_k(K, N), "schedule": schedule, **cfg}
            results, handles = {}, []
            try:
                for m in m_list:
                    r = {}
                    for dt, key in ((torch.float32, "fp32_diff"), (torch.bfloat16, "bf16_diff")):
                        y = launch.gemm(x[:m], w, out_dtype=dt, schedule=schedule, config=cfg, _handles=handles)
                        r[key] = _ndiff(y, ref[dt][:m])
                    results[f"M={m}"] = r
                row["results"] = results
                row["identical"] = all(v == 0 for r in results.values() for v in r.values())
                row["mma"] = _mma_form(handles)
            except UnsupportedConfigError as e:
                row["skipped"] = str(e)
            except Exception as e:  # noqa: BLE001  (e.g. out of shared memory): recorded, not hidden
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            status = row.get("identical", row.get("skipped", row.get("error")))
            print(f"{name} {schedule} {cfg} mma={row.get('mma')} -> {status}", flush=True)
    summary = {}
    for axis in ("schedule", "BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "GROUP_M", "mma"):
        per = {}
        for r in rows:
            if "identical" in r and axis in r:
                per.setdefault(str(r[axis]), []).append(r["identical"])
        summary[axis] = {v: {"configs": len(ok), "all_identical": all(ok)} for v, ok in per.items()}
    ran = [r for r in rows if "identical" in r]
    try:
        from rlk.provenance import capability_record  # noqa: PLC0415

        prov = capability_record(contracts=["gemm.bf16.v1"])
    except Exception:  # noqa: BLE001
        import triton

        prov = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
    doc = {"provenance": prov, "contract_id": contract.CONTRACT_ID, "contract_bit_hash": contract.CONTRACT.bit_hash(),
           "reference": {"M": REF_M, "plan": ref_plan}, "m_list": m_list,
           "verdict": {"configs_run": len(ran), "all_identical": all(r["identical"] for r in ran),
                       "not_run": len(rows) - len(ran)},
           "summary": summary, "rows": rows, "seconds": round(time.time() - t0, 1)}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(json.dumps(doc["verdict"]), f"-> {args.out}")
    return 0 if doc["verdict"]["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
