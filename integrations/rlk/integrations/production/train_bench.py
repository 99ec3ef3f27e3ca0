"""The trainer half of one arm of :mod:`rlk.integrations.production.bench` (``bench train``):
megatron-core on the rollout's tokens, phase by phase, in a process of its own.

    python -m rlk.integrations.production.bench train --arm pp|rr --dir CKPT --rollout R/x_rollout.json \\
        --out R/x_train.json [--micro-tokens 16384] [--recompute full] [--optimizer-step] [--warmup 1]

Trainers (both TP=1, bf16 parameters, megatron's ``DistributedDataParallel`` with fp32
``main_grad``, its no-pipelining schedule, sequences packed ``thd`` in micro-batches of whole
sequences of at most ``--micro-tokens`` tokens, request order, ``replay_probe.microbatches``):

* ``rr``: :class:`rlk.integrations.megatron.actor.MegatronActor` (rlk's strict spec, fused LM
  head + loss). Old logp = the rollout's, **reused**: the actor forward's logp of every response
  token is compared with the rollout's as raw fp32 bytes; one differing token and the run fails
  closed (exit status 3, the count in the message and the record) before any optimizer step.
* ``pp``: megatron's local spec (:class:`rlk.integrations.megatron.native.NativeActor`) with
  :class:`~rlk.integrations.megatron.varlen_attention.VarlenCoreAttention` in the core-attention
  slot, megatron's RoPE, its per-token cross entropy over materialized logits (logp = -ce). Old
  logp **recomputed** by a no-grad trainer forward (the stock engine's logp is not the
  trainer's).

Phases, each between ``torch.cuda.synchronize()`` calls on CUDA, with its peak allocated memory
(``max_memory_allocated``, reset before it): ``old_logp`` (pp), ``ref_logp`` (no-grad forward;
the reference policy is the same checkpoint here), ``actor_fwd_bwd`` (GRPO's clipped per-token
loss, ``rlk.rl.grpo.token_loss_fn``, clip 0.2, normalized by the batch's response tokens;
forward + backward into ``main_grad``), ``optimizer`` (only with ``--optimizer-step``, which
builds megatron's Adam; it does not fit at full Qwen3-8B depth:
``actor_bench.REASON_REDUCED_DEPTH``). Warm-up rule, the same for both arms: before the timed
phases, ``--warmup`` untimed passes of the no-grad forward and of forward + backward over every
micro-batch (an RL trainer's steady state: Triton compiles its kernels once per shape variant,
e.g. a new row-count parity, and cuBLAS and the allocator warm up; with only the first
micro-batch warmed, a cold Triton cache compiled inside the timed phases and slowed R/R's trainer
phases by a third on the H200). Model load is timed but not counted. Before the model loads,
``rlk.bench.health.probe`` records the GPU's copy bandwidth and clocks (``health``): the report
drops a pair outside the envelope of :mod:`rlk.bench.health`.

``--profile``: after the timed phases, each runs once more under ``torch.profiler``; the record's
``attribution`` holds device seconds per kernel category, launches and host idle per phase
(:func:`profiled`). Those repeats are never counted.

Advantages (:data:`ADVANTAGES`): one per sequence, ``torch.randn(n, generator=seed)``, on each
of its response tokens.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

LR = 1e-5
CLIP = 0.2
ADVANTAGES = ("sequence i's advantage = torch.randn(n, generator=torch.Generator().manual_seed(seed))[i], "
              "on every response token of sequence i")
REFERENCE = "the reference policy is the same checkpoint as the actor in this benchmark"
NATIVE_TRAINER = ("megatron-core {v} local spec, torch varlen flash attention, torch RMSNorm, cuBLAS; "
                  "no TransformerEngine (not carried)")
STRICT_TRAINER = "megatron-core {v} GPTModel on rlk's strict spec (MegatronActor), rlk Triton kernels"
FAIL_CLOSED_RC = 3
_T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[train {time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class FailClosed(RuntimeError):
    """R/R's old-logp reuse refused: the rollout's logp are not the trainer's, bit for bit."""


# ---- helpers -----------------------------------------------------------------------------------
def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, tokens: int) -> tuple[object, dict]:
    """``fn()`` between synchronizations; ``(result, {"seconds", "tokens", "tok_per_s",
    "peak_allocated_gib"?})``; garbage collection and the allocator's cache release run first,
    untimed."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    dt = time.perf_counter() - t0
    rec = {"seconds": round(dt, 4), "tokens": tokens, "tok_per_s": round(tokens / dt, 1) if dt > 0 else None}
    if device.type == "cuda":
        rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return out, rec


def profiled(fn, device) -> dict:
    """One more run of ``fn`` under ``torch.profiler``: its wall time, device time per kernel
    category (:func:`rlk.bench.attribution.kernel_times`), launches and host idle (wall minus
    device time; one stream). On the CPU there are no device kernels: device time 0."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlk.bench.attribution import kernel_times

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    gc.collect()
    _sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        wall = time.perf_counter() - t0
    per_cat, launches, total_us = kernel_times(prof)
    return {"wall_s": round(wall, 4), "device_s": round(total_us / 1e6, 4),
            "host_idle_s": round(max(0.0, wall - total_us / 1e6), 4), "launches": launches,
            "device_s_by_category": {k: round(v / 1e6, 4) for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])}}


def compare_bitwise(rollout: list, trainer: list) -> dict:
    """Raw fp32 bytes of every response token (``torch.equal`` on ``.view(torch.int32)``): a
    rollout value that is not an fp32 value counts as differing too."""
    import torch

    n = bad = 0
    first, max_abs = None, 0.0
    for i, (e, t) in enumerate(zip(rollout, trainer)):
        e32, t32 = e.to(torch.float32), t.detach().to(torch.float32).cpu()
        neq = (e32.view(torch.int32) != t32.view(torch.int32)) | (e32.to(torch.float64) != e.to(torch.float64))
        n += e32.numel()
        k = int(neq.sum())
        bad += k
        if k:
            max_abs = max(max_abs, float((e.to(torch.float64) - t32.double()).abs().max()))
            if first is None:
                j = int(torch.nonzero(neq)[0])
                first = {"request": i, "token": j, "rollout": float(e[j]), "trainer": float(t32[j])}
    return {"compared_tokens": n, "mismatches": bad, "max_abs_diff": max_abs, "first_mismatch": first}


# ---- the two trainers --------------------------------------------------------------------------
class ArmTrainer:
    """megatron-core trainer of one arm: ``"rr"`` GPTModel on rlk's strict spec, ``"pp"`` its
    local spec with torch's varlen attention (:class:`VarlenCoreAttention`) and cuBLAS.
    ``forward(pk) -> logp [T]`` (no grad), ``forward_backward([(pk, token_loss)]) -> [logp [T]]``
    over megatron's schedule, ``step()``, ``model`` (the module megatron trains)."""

    def __init__(self, arm, cfg, hf, device, recompute, optimizer):
        from rlk.integrations.megatron import version

        self.arm, self.cfg, self.device = arm, cfg, device
        if arm == "rr":
            from rlk.integrations.megatron.actor import MegatronActor

            self.actor = MegatronActor(cfg, hf, lr=LR, recompute=recompute, device=str(device), optimizer=optimizer)
            self.model, self.ddp, self.optimizer = self.actor.model, self.actor.ddp, self.actor.optimizer
            self.description = STRICT_TRAINER.format(v=version())
        else:
            from rlk.integrations.megatron.native import NativeActor
            from rlk.integrations.megatron.varlen_attention import VarlenCoreAttention

            self.actor = NativeActor(cfg, hf, device=str(device), recompute=recompute,
                                     core_attention=VarlenCoreAttention, optimizer=optimizer, lr=LR)
            self.model, self.ddp, self.optimizer = self.actor.f16, self.actor.ddp, self.actor.optimizer
            self.description = NATIVE_TRAINER.format(v=version())

    def forward(self, pk):
        """No-grad logp ``[T]`` in eval mode (megatron's activation recompute applies to training
        forwards only, as in its forward-only schedule)."""
        import torch

        from rlk.integrations.megatron.actor import cuda_names_on_cpu

        self.model.eval()
        if self.arm == "rr":
            from rlk.integrations.megatron.replay_probe import _forward
            from rlk.kernels.common import host_validated

            with host_validated():
                return _forward(self.model, pk)
        with torch.no_grad(), cuda_names_on_cpu():
            return self.actor.packed_logp(self.model, pk)

    def forward_backward(self, batches):
        if self.arm == "rr":
            from rlk.kernels.common import host_validated

            with host_validated():
                return self.actor.forward_backward(batches)
        return self.actor.forward_backward_packed(batches)

    def step(self):
        return self.actor.step()


# ---- the run -----------------------------------------------------------------------------------
def run_train(arm: str, model_dir: str, rollout_path: str, out: str, *, micro_tokens: int = 16384,
              recompute: str | None = "full", optimizer_step: bool = False, warmup: int = 1, seed: int = 0,
              device: str | None = None, profile: bool = False) -> dict:
    """The trainer half (module docstring); writes ``out`` and returns the record. Raises
    :class:`FailClosed` (after writing the record) when R/R's reuse check fails."""
    from rlk import determinism

    if not os.environ.get("TRITON_INTERPRET"):
        determinism.configure_cpu_interpreter_without_gpu()  # before any kernel module is imported
    import torch

    from rlk.integrations.megatron.replay_probe import microbatches
    from rlk.integrations.production import records
    from rlk.models.qwen3 import Qwen3Config, load_safetensors
    from rlk.models.qwen3 import checkpoint
    from rlk.replay import trainer
    from rlk.replay.rollout import check_tokens
    from rlk.rl import grpo

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = Qwen3Config.from_json(os.path.join(model_dir, "config.json"))
    ck = checkpoint.read_record(model_dir)
    prompts, responses, roll_lp = records.load_rollout(rollout_path)
    check_tokens(cfg.vocab_size, prompts, responses)
    n = len(prompts)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    if max(lengths) > cfg.max_position_embeddings:
        raise SystemExit(f"a sequence of {max(lengths)} tokens exceeds max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    groups = microbatches(lengths, micro_tokens)
    packs = [trainer.pack(prompts, responses, g, device=dev) for g in groups]
    T = sum(lengths)
    n_resp = sum(len(r) for r in responses)
    adv_seq = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    say(f"{arm}: {n} sequences, {T} packed tokens ({n_resp} response) in {len(packs)} micro-batches of <= "
        f"{micro_tokens}; {cfg.num_hidden_layers} layers on {dev}")

    from rlk.bench import health

    probe = health.probe()  # before the model: the copy test needs 2 GiB free
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    hf = load_safetensors(model_dir, cfg, device=str(dev))
    tr = ArmTrainer(arm, cfg, hf, dev, recompute, optimizer_step)
    del hf
    _sync(dev)
    load_s = time.perf_counter() - t0
    say(f"{arm}: model loaded in {load_s:.1f} s: {tr.description}")

    adv_per_request = [adv_seq[i].expand(len(responses[i])) for i in range(n)]

    def batches(old_per_request):
        return [(pk, grpo.token_loss_fn(trainer.response_rows(pk, old_per_request).to(dev),
                                        trainer.response_rows(pk, adv_per_request).to(dev), pk.loss_mask, CLIP,
                                        n_resp)) for pk in packs]

    def score_all():
        lp: list = [None] * n
        for pk in packs:
            for i, t in enumerate(trainer.response_logp(pk, tr.forward(pk), n)):
                if t is not None:
                    lp[i] = t
        return lp

    for k in range(warmup):  # untimed (module docstring): every micro-batch's shapes
        t_w = time.perf_counter()
        score_all()
        tr.forward_backward(batches([r.to(torch.float32) for r in roll_lp]))
        _sync(dev)
        say(f"{arm}: warm-up pass {k + 1} of {warmup} (forward + forward/backward, {len(packs)} micro-batches, "
            f"untimed) {time.perf_counter() - t_w:.1f} s")
    phases: dict = {}
    rec = {"arm": arm, "device": str(dev), "trainer": tr.description, "model_load_s": round(load_s, 2),
           "sequences": n, "packed_tokens": T, "response_tokens": n_resp, "micro_batches": len(packs),
           "micro_tokens": micro_tokens, "layers": cfg.num_hidden_layers, "config": cfg.name,
           "recompute": recompute, "warmup_passes": warmup, "advantages": ADVANTAGES, "advantage_seed": seed,
           "reference_policy": REFERENCE, "loss": f"rlk.rl.grpo clipped per-token loss, clip {CLIP}",
           "checkpoint_sha256": ck.get("sha256"), "health": probe, "phases": phases}
    if arm == "pp":
        old, phases["old_logp"] = timed(score_all, dev, T)
        rec["old_logp_source"] = "recomputed by a no-grad trainer forward"
        rec["rollout_vs_trainer_logp"] = compare_bitwise(roll_lp, old)
    else:
        old = [r.to(torch.float32) for r in roll_lp]
        rec["old_logp_source"] = "reused from the rollout (checked bitwise against the actor forward)"
    _, phases["ref_logp"] = timed(score_all, dev, T)
    bs = batches(old)
    logps, phases["actor_fwd_bwd"] = timed(lambda: tr.forward_backward(bs), dev, T)
    actor_lp: list = [None] * n
    for pk, lp in zip(packs, logps):
        for i, t in enumerate(trainer.response_logp(pk, lp, n)):
            if t is not None:
                actor_lp[i] = t
    if arm == "rr":
        cmp = compare_bitwise(roll_lp, actor_lp)
        rec["rollout_vs_trainer_logp"] = cmp
        rec["logp_mismatches"] = cmp["mismatches"]
        if cmp["mismatches"]:
            msg = (f"R/R fails closed: old-logp reuse refused, {cmp['mismatches']} of {cmp['compared_tokens']} "
                   f"response tokens differ bitwise between the rollout logp and the actor forward's logp "
                   f"(first: {json.dumps(cmp['first_mismatch'])}); no optimizer step ran")
            rec["failed"] = msg
            records.write_json(out, dict(rec, versions=_versions()))
            raise FailClosed(msg)
    if profile:  # after the timed phases: the profiler never touches the counted times
        runs = {"ref_logp": score_all, "actor_fwd_bwd": lambda: tr.forward_backward(bs)}
        if arm == "pp":
            runs = {"old_logp": score_all, **runs}
        rec["attribution"] = {ph: profiled(fn, dev) for ph, fn in runs.items()}
        say(f"{arm}: attribution: " + ", ".join(f"{ph} {v['device_s']:.3f} s on the device of {v['wall_s']:.3f} s"
                                              for ph, v in rec["attribution"].items()))
    if optimizer_step:
        _, phases["optimizer"] = timed(tr.step, dev, T)
    else:
        rec["optimizer"] = {"skipped": "no --optimizer-step (megatron built without an optimizer: "
                                       "DDP main_grad only)"}
    rec["versions"] = _versions()
    rec["provenance"] = _provenance(arm, tr.description, cfg)
    records.write_json(out, rec)
    say(f"{arm}: " + ", ".join(f"{k} {v['seconds']:.3f} s" for k, v in phases.items()))
    return rec


def _versions() -> dict:
    from rlk.integrations.megatron.actor_bench import _versions as megatron_versions

    return megatron_versions()


def capability(arm: str, extra: dict | None = None) -> dict:
    """The capability record of an arm's trainer on this machine and tree (``rr``: strict, the
    contracts of rlk's megatron spec; ``pp``: native, every contract)."""
    from rlk.integrations.megatron import spec
    from rlk.provenance import capability_record

    ids = sorted(set(spec.CONTRACTS.values())) if arm == "rr" else None
    return capability_record("strict" if arm == "rr" else "native", contract_ids=ids, extra=extra)


def _provenance(arm: str, description: str, cfg) -> dict:
    try:
        return capability(arm, extra={"engine": description, "config": cfg.name, "layers": cfg.num_hidden_layers})
    except Exception as e:  # recorded, never invented
        return {"error": f"{type(e).__name__}: {e}"}
