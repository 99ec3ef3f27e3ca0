"""The files one arm of the production benchmark writes and reads, and its phase totals.

* rollout file ``<stem>.safetensors`` (next to the rollout JSON): ``prompt_ids`` int32 (flat),
  ``prompt_lens`` int64 ``[n]``, ``response_ids`` int32 (flat), ``response_lens`` int64 ``[n]``,
  ``logp`` float64 (flat; the engine's returned logprob of each response token, widened from
  its fp32 value). The trainer reads prompts and responses from it, not from the workload rule,
  so a phase can be re-run on exactly what the engine generated.
* arm JSON ``pair<i>_<arm>.json``: ``rollout`` and ``train`` records merged, ``phases``
  (seconds), ``total_s`` (their sum), ``logp_mismatches`` (rr) and the pair's order.
"""

from __future__ import annotations

import json
import os

import torch

from rlk.errors import UnsupportedConfigError

ARMS = ("pp", "rr")
# vLLM arm of each benchmark arm (rlk.integrations.vllm.engine_bench's names).
VLLM_ARM = {"pp": "stock", "rr": "rlk"}
# Phases in the order they run; ``old_logp`` is P/P's only (R/R reuses the rollout's logp) and
# ``optimizer`` is counted only when it ran (--optimizer-step).
PHASES = ("rollout_generate", "old_logp", "ref_logp", "actor_fwd_bwd", "optimizer")


def arm_path(results: str, pair: int, arm: str) -> str:
    return os.path.join(results, f"pair{pair}_{arm}.json")


# The parts of a trainer's capability record that a new process can compare before it runs a
# pair: the report refuses pairs of one arm whose fingerprints differ, and these are what the
# fingerprint covers apart from the run's own fields (extra, image, created_at).
PREFLIGHT_FIELDS = ("route", "device", "toolchain", "contracts", "kernel_sources", "tuning_tables",
                    "compiled_kernels", "environment")


def arm_files(results: str) -> dict[int, dict[str, str]]:
    """{pair index: {arm: path}} of the arm files ``pair<i>_<arm>.json`` in ``results``."""
    import glob
    import re

    found: dict[int, dict[str, str]] = {}
    for path in glob.glob(os.path.join(results, "pair*_*.json")):
        m = re.fullmatch(r"pair(\d+)_(pp|rr)\.json", os.path.basename(path))
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = path
    return found


def complete_pairs(results: str) -> list[int]:
    """Indices of the pairs in ``results`` with both arm files, ascending."""
    return sorted(i for i, arms in arm_files(results).items() if set(arms) == set(ARMS))


def provenance_conflicts(results: str, current) -> list[str]:
    """Where this machine and tree (``current()``: {arm: capability record}, called only when an
    earlier pair carries a trainer provenance) differ from the complete pairs already in
    ``results``, per arm against its first such pair: ``"<arm> (pair<i>): <dotted field>"``.
    Empty when nothing differs or there is no earlier pair."""
    from rlk import provenance

    out, now = [], None
    for arm in ARMS:
        for i in complete_pairs(results):
            with open(arm_path(results, i, arm)) as f:
                prov = (json.load(f).get("train") or {}).get("provenance") or {}
            if not prov or "error" in prov:
                continue
            now = now if now is not None else current()
            old = {k: prov.get(k) for k in PREFLIGHT_FIELDS}
            new = {k: now[arm].get(k) for k in PREFLIGHT_FIELDS}
            out += [f"{arm} (pair{i}): {d}" for d in provenance.differences(old, new)]
            break
    return out


def stem(path: str) -> str:
    return os.path.splitext(path)[0]


def save_rollout(path: str, prompts: list[list[int]], responses: list[list[int]], logp: torch.Tensor) -> None:
    """``path``: the rollout JSON's path (tensors go to ``<stem>.safetensors``)."""
    from safetensors.torch import save_file

    n_resp = sum(map(len, responses))
    if len(prompts) != len(responses) or logp.numel() != n_resp:
        raise UnsupportedConfigError(f"rollout: {len(prompts)} prompts, {len(responses)} responses, "
                                     f"{logp.numel()} logp for {n_resp} response tokens")
    flat = lambda xs: torch.tensor([t for x in xs for t in x], dtype=torch.int32)  # noqa: E731
    save_file({"prompt_ids": flat(prompts), "prompt_lens": torch.tensor([len(p) for p in prompts]),
               "response_ids": flat(responses), "response_lens": torch.tensor([len(r) for r in responses]),
               "logp": logp.to(torch.float64).contiguous()}, stem(path) + ".safetensors")


def load_rollout(path: str) -> tuple[list[list[int]], list[list[int]], list[torch.Tensor]]:
    """(prompts, responses, per-request logp float64) of a rollout written by :func:`save_rollout`."""
    from safetensors.torch import load_file

    f = stem(path) + ".safetensors"
    if not os.path.exists(f):
        raise UnsupportedConfigError(f"rollout tensors {f} are missing (written by `bench rollout`)")
    t = load_file(f)
    missing = {"prompt_ids", "prompt_lens", "response_ids", "response_lens", "logp"} - set(t)
    if missing:
        raise UnsupportedConfigError(f"{f}: missing {sorted(missing)}")

    def split(flat, lens):
        out, o = [], 0
        for n in lens:
            out.append(flat[o:o + n])
            o += n
        if o != flat.numel():
            raise UnsupportedConfigError(f"{f}: lengths add up to {o}, {flat.numel()} values stored")
        return out

    pl, rl = t["prompt_lens"].tolist(), t["response_lens"].tolist()
    if len(pl) != len(rl) or not pl or min(pl) < 1 or min(rl) < 1:
        raise UnsupportedConfigError(f"{f}: {len(pl)} prompts / {len(rl)} responses, every one non-empty")
    prompts = [x.tolist() for x in split(t["prompt_ids"], pl)]
    responses = [x.tolist() for x in split(t["response_ids"], rl)]
    return prompts, responses, split(t["logp"].to(torch.float64), rl)


def phase_seconds(rollout: dict, train: dict) -> dict[str, float]:
    """Seconds of each counted phase (module docstring): engine start and model load excluded."""
    out = {"rollout_generate": float(rollout["generate_s"])}
    for k, v in train["phases"].items():
        if "seconds" in v:
            out[k] = float(v["seconds"])
    unknown = set(out) - set(PHASES)
    if unknown:
        raise UnsupportedConfigError(f"unknown phases {sorted(unknown)}")
    return {k: out[k] for k in PHASES if k in out}


def merge(arm: str, rollout: dict, train: dict, pair: dict | None = None) -> dict:
    """The arm record: both halves, the counted phases, their total, the rr mismatch count."""
    phases = phase_seconds(rollout, train)
    rec = {"arm": arm, "pair": pair or {}, "phases": phases, "total_s": round(sum(phases.values()), 4),
           "logp_mismatches": train.get("logp_mismatches"),
           "spec": {"layers": train["layers"], "sequences": train["sequences"], "workload": rollout["workload"],
                    "response_tokens": train["response_tokens"], "packed_tokens": train["packed_tokens"],
                    "micro_batches": train["micro_batches"], "micro_tokens": train["micro_tokens"],
                    "recompute": train["recompute"]},
           "rollout": rollout, "train": train}
    att = dict(train.get("attribution") or {})
    if rollout.get("attribution"):
        att["rollout_generate"] = rollout["attribution"]
    if att:
        rec["attribution"] = att  # profiled repeats of the phases (``--profile``), never in the totals
    return rec


def write_json(path: str, rec: dict) -> None:
    """Written to a temporary name, then renamed: a killed run leaves no half file behind (a
    pair with both arm files is complete)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
