"""Bitwise comparison of per-sequence logp, with the first mismatch and a diagnostic artifact."""

from __future__ import annotations

import json
import os

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous().cpu().view(torch.int32)


def compare_logp(a: list[torch.Tensor], b: list[torch.Tensor], prompt_lens: list[int] | None = None,
                 names=("a", "b")) -> dict:
    """Compares two lists of per-sequence fp32 logp vectors element by element (raw bytes).

    Returns ``mismatch_count``, ``max_abs_diff``, ``compared_elements``, ``torch_equal`` (every
    sequence ``torch.equal``), ``sequences``, and on a mismatch ``first_mismatch`` = {sequence,
    response_index, position (absolute, when ``prompt_lens`` is given), both values and hex}.
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} sequences vs {len(b)}")
    mism, maxd, n, teq, first = 0, 0.0, 0, True, None
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.detach().float().cpu(), y.detach().float().cpu()
        if x.shape != y.shape:
            raise ValueError(f"sequence {i}: shapes {tuple(x.shape)} vs {tuple(y.shape)}")
        teq = teq and torch.equal(x, y)
        diff = _bits(x) != _bits(y)
        n += x.numel()
        if bool(diff.any()):
            mism += int(diff.sum())
            d = (x - y).abs()
            d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
            maxd = max(maxd, float(d.max()))
            if first is None:
                j = int(torch.nonzero(diff)[0])
                first = {"sequence": i, "response_index": j,
                         names[0]: float(x[j]), names[1]: float(y[j]),
                         f"{names[0]}_hex": f"0x{int(_bits(x)[j]) & 0xFFFFFFFF:08x}",
                         f"{names[1]}_hex": f"0x{int(_bits(y)[j]) & 0xFFFFFFFF:08x}"}
                if prompt_lens is not None:
                    first["position"] = prompt_lens[i] - 1 + j
    out = {"sequences": len(a), "compared_elements": n, "mismatch_count": mism, "max_abs_diff": maxd,
           "torch_equal": bool(teq)}
    if first is not None:
        out["first_mismatch"] = first
    return out


def localize(trainer_probes, rollout_probes, prompt_lens, response_lens) -> dict | None:
    """First (layer probe, sequence, position) whose hidden differs between the patterns.

    ``trainer_probes``: list of ``(Packed, probes)`` from ``trainer.score(probes=[])``;
    ``rollout_probes``: per request ``{"attn_out.L": [len, H], ..., "final": ...}`` from the
    rollout (positions ``0 .. p + r - 2``). Probe names are searched layer by layer.
    """
    flat = {}
    for pk, pr in trainer_probes:
        cu = pk.cu_seqlens.tolist()
        for name, val in pr.items():
            items = [(f"{name}.{li}", t) for li, t in enumerate(val)] if isinstance(val, list) else [(name, val)]
            for key, t in items:
                for j, i in enumerate(pk.order):
                    flat.setdefault(key, {})[i] = t[cu[j]: cu[j + 1]].cpu()
    if not rollout_probes:
        return None
    keys = sorted(rollout_probes[0], key=_probe_order)
    for key in keys:
        for i, rp in enumerate(rollout_probes):
            tr = flat[key][i][: rp[key].shape[0]]
            diff = (tr.contiguous().view(torch.int16) != rp[key].contiguous().view(torch.int16)) \
                if tr.dtype == torch.bfloat16 else (tr != rp[key])
            if bool(diff.any()):
                row = int(torch.nonzero(diff.any(-1))[0])
                return {"probe": key, "sequence": i, "position": row,
                        "elements_differing_in_row": int(diff[row].sum()),
                        "max_abs_diff_in_row": float((tr[row].float() - rp[key][row].float()).abs().max())}
    return {"probe": None, "note": "every probe equal: the difference is after the final norm (logp)"}


def _probe_order(k: str):
    if k == "final":
        return (10**9, 2)
    name, layer = k.rsplit(".", 1)
    return (int(layer), 0 if name == "attn_out" else 1)


def write_diagnostic(path: str, report: dict) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True, default=str)
    return path
