"""Frozen replay fixture: ``fixture.safetensors`` (tensors) + ``fixture.json`` (metadata).

Tensors (flat, concatenated in request order; lengths give the split):
  ``prompt_tokens [sum p] int64``, ``prompt_lens [N] int64``, ``response_tokens [sum r] int64``,
  ``response_lens [N] int64``, ``arrival_steps [N] int64``,
  ``logp_mask [sum (p + r)] uint8`` (packed trainer rows that predict a response token),
  ``page_tables [N, max_pages] int32`` (pages each request used, in block order, -1 padded),
  ``rollout_logp [sum r] float32`` (selected-token logp recorded by the rollout).
Metadata: model config, weights (seed + generation device/dtype + ``calibration``: the weight
recipe and its factors, or checkpoint sha256), ``distribution`` (next-token statistics of the
recorded rollout: entropy of every sampled row and the sampled logp,
:func:`rlk.models.qwen3.distribution.distribution_stats`; the gate's health rule reads it),
rollout settings, contract IDs, route, provenance record, step statistics.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

FORMAT = "rlk.replay.fixture.v1"


@dataclasses.dataclass
class Fixture:
    prompts: list[list[int]]
    responses: list[list[int]]
    arrival_steps: list[int]
    page_tables: list[list[int]]
    rollout_logp: list[torch.Tensor]
    meta: dict

    @property
    def prompt_lens(self):
        return [len(p) for p in self.prompts]

    @property
    def response_lens(self):
        return [len(r) for r in self.responses]


def _split(flat: torch.Tensor, lens):
    out, o = [], 0
    for n in lens:
        out.append(flat[o:o + n])
        o += n
    return out


def save(fx: Fixture, out_dir: str) -> tuple[str, str]:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    n = len(fx.prompts)
    maxp = max([len(p) for p in fx.page_tables] + [1])
    pt = torch.full((n, maxp), -1, dtype=torch.int32)
    for i, p in enumerate(fx.page_tables):
        pt[i, : len(p)] = torch.tensor(p, dtype=torch.int32)
    mask = []
    for p, r in zip(fx.prompts, fx.responses):
        L = len(p) + len(r)
        mask += [len(p) - 1 <= t < L - 1 for t in range(L)]
    tensors = {
        "prompt_tokens": torch.tensor([t for p in fx.prompts for t in p], dtype=torch.int64),
        "prompt_lens": torch.tensor(fx.prompt_lens, dtype=torch.int64),
        "response_tokens": torch.tensor([t for r in fx.responses for t in r], dtype=torch.int64),
        "response_lens": torch.tensor(fx.response_lens, dtype=torch.int64),
        "arrival_steps": torch.tensor(fx.arrival_steps, dtype=torch.int64),
        "logp_mask": torch.tensor(mask, dtype=torch.uint8),
        "page_tables": pt,
        "rollout_logp": torch.cat([t.detach().float().cpu() for t in fx.rollout_logp]),
    }
    st = os.path.join(out_dir, "fixture.safetensors")
    js = os.path.join(out_dir, "fixture.json")
    save_file(tensors, st, metadata={"format": FORMAT})
    meta = dict(fx.meta, format=FORMAT, sequences=n, response_tokens=int(sum(fx.response_lens)))
    with open(js, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
    return st, js


def load(path: str) -> Fixture:
    """``path``: the fixture folder (or its ``fixture.json`` / ``fixture.safetensors``)."""
    from safetensors.torch import load_file

    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    t = load_file(os.path.join(d, "fixture.safetensors"))
    with open(os.path.join(d, "fixture.json")) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{d}: fixture format {meta.get('format')!r}, expected {FORMAT}")
    pl, rl = t["prompt_lens"].tolist(), t["response_lens"].tolist()
    pts = [[int(x) for x in row if x >= 0] for row in t["page_tables"].tolist()]
    return Fixture(
        prompts=[x.tolist() for x in _split(t["prompt_tokens"], pl)],
        responses=[x.tolist() for x in _split(t["response_tokens"], rl)],
        arrival_steps=t["arrival_steps"].tolist(), page_tables=pts,
        rollout_logp=_split(t["rollout_logp"], rl), meta=meta)
