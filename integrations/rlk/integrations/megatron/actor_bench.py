"""Benchmark and exactness probe of one megatron-core actor step: rlk's strict spec against
megatron-core's own native local (no TransformerEngine, no Apex) GPT model, on one batch.

    python -m rlk.integrations.megatron.actor_bench --out DIR [--config qwen3-8b] [--layers 8] \\
        [--seqs 16] [--seq-len 2048] [--recompute full] [--recipe calibrated.v1] [--seed 0] \\
        [--optimizer-offload [FRACTION]] [--skip-rlk-reference] [--skip-native] [--native-micro-batches N] \
        [--device cuda] [--tag h200]

Writes ``DIR/megatron_actor_<tag>.json`` (tag from the GPU's name: ``h100``, ``h200``, else
``cuda``; ``cpu`` on the CPU), one progress line per phase on stderr; exit status 1 when a check fails.

Batch: ``seqs`` sequences of ``seq-len`` seeded random token ids (the first half prompt, the
second half response), packed; ``Qwen3Config.named(config)`` with ``num_hidden_layers = layers``;
bf16 Hugging Face weights from ``rlk.models.qwen3.random_weights(cfg, seed, recipe=...)``; GRPO's
clipped per-token loss (``rlk.rl.grpo``, clip 0.2, old logp = rlk's strict forward, advantages
seeded as in ``actor_probe``). A step is megatron's forward_backward (no-pipelining schedule,
DDP fp32 ``main_grad``) + its DistributedOptimizer Adam step (lr 1e-5). ``--optimizer-offload``
(all parameters, or the FRACTION given) builds both arms' optimizers with megatron's CPU offload
(``actor.training_wrappers``: fp32 main parameters and Adam moments on the host); the record's
``spec`` says so and where the states live, each arm its optimizer's placement.

* ``strict``: :class:`rlk.integrations.megatron.actor.MegatronActor`. Step 1 (Triton compiles
  included) is fingerprinted; step 2 is timed per phase (``torch.cuda.synchronize`` around each)
  with its peak memory (``max_memory_allocated`` / ``max_memory_reserved``, reset before it) and
  the process's peak host RSS so far (``getrusage`` ``ru_maxrss``: it cannot be reset).
* ``run_to_run``: step 1 again in a fresh process (``--worker``): per-tensor fingerprints of the
  logp, every main_grad after forward_backward and every bf16 weight after the optimizer step.
* ``vs_rlk_trainer``: rlk's own trainer (``Qwen3.trainer_logp``, strict, same loss) against step
  1's main_grads, as ``actor_probe``: logp bitwise; every main_grad but the LM head bitwise equal
  to rlk's bf16 gradient widened to fp32; the LM head's main_grad (fp32-accumulated by the fused
  LM head + loss) rounded to bf16 equal to rlk's. Compared tensor by tensor on the device (one
  fp32 widening at a time); ``--skip-rlk-reference`` leaves it out (see Memory).
* ``native``: megatron's ``GPTModel`` with ``get_gpt_layer_local_spec(qk_layernorm=True,
  normalization="RMSNorm")`` (torch RMSNorm, local ``DotProductAttention`` on ``[b, s]`` with a
  causal mask: it takes no packed THD), RoPE (``rope_theta``), SwiGLU, fusions that need Apex or
  TE off, ``Float16Module`` (bf16) as megatron's training wraps it, the same recompute, DDP and
  optimizer (``actor.training_wrappers``), the same weights (checked by fingerprint), labels ->
  megatron's per-token cross entropy (``vocab_parallel_cross_entropy`` over materialized fp32
  logits), logp = -ce, the same loss. Timed as strict. ``--native-micro-batches N`` runs its
  batch as N micro-batches (``micro_batch_size`` = seqs / N, gradients accumulated), as megatron's
  users fit a batch whose fp32 logits (4 bytes x tokens x vocabulary: 20 GB at 32k tokens) do not
  fit beside the model; the record's ``spec.micro_batches`` says so. The strict arm's fused LM head
  materializes no logits and runs the batch as one micro-batch.

Reduced depth: full Qwen3-8B (36 layers, 8.2B parameters) needs bf16 params + fp32 main_grad +
fp32 main params + two fp32 Adam states = 18 bytes/param = 147 GB of model state alone, more than
one H200's 139 GiB; ``--layers`` (default 8: 2.8B parameters, ~50 GB of state) keeps every
tensor's shape and the LM head of the real model.

Memory at full depth (estimates, 8.19B parameters, 32k tokens, full recompute):

* ``--optimizer-offload``: the GPU holds bf16 params + fp32 main_grad (6 bytes/param, 49 GB) +
  activations; megatron's HybridDeviceOptimizer holds on the host the fp32 main params, both
  moments and an fp32 copy of each gradient (16 bytes/param: 131 GB = 122 GiB), and the host
  AdamW's two temporaries of the largest tensor (4.6 GiB for the LM head): more than a 128 GiB
  machine leaves (the H100 / H200 machines report ~126 GiB MemTotal). A fraction below 1 keeps the
  last parameters in megatron's order (the embedding, the first layers, the norms) on the GPU at
  12 bytes/param: ``--optimizer-offload 0.85`` offloads the LM head, layers 35..4 and most of 3
  (6.97B parameters): ~104 GiB host + temporaries, ~14 GiB more GPU.
* rlk's trainer (``vs_rlk_trainer``) saves every layer's activations (no recompute): ~141 KB per
  token and layer at Qwen3-8B widths, ~167 GB at 36 x 32k tokens, beyond one H200 however the
  optimizer is placed; at full depth pass ``--skip-rlk-reference`` or at most ~12k tokens.
* the comparisons hold no second copy of the gradients: run to run and native compare device
  fingerprints, the rlk comparison widens one tensor at a time.

Fingerprints (:func:`rlk.rl.sync.tensor_fingerprint`) are exact integer hashes computed on the
device (no 30 GB host copy): integer sums modulo a prime are exact in any reduction order.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time

from rlk import determinism

if not os.environ.get("TRITON_INTERPRET"):
    determinism.configure_cpu_interpreter_without_gpu()

import torch  # noqa: E402

LM_HEAD = "output_layer.weight"
LR = 1e-5
REASON_REDUCED_DEPTH = ("full Qwen3-8B (36 layers, 8.2B params) needs 18 bytes/param (bf16 param, fp32 main_grad, "
                        "fp32 main param, 2 fp32 Adam states) = 147 GB > one H200's 139 GiB")
REASON_DEPTH_OFFLOAD = ("--optimizer-offload: the GPU holds 6 bytes/param (bf16 param, fp32 main_grad; 49 GB at full "
                        "Qwen3-8B depth), the host 16 bytes/param of offloaded state (fp32 main param, 2 fp32 Adam "
                        "states, fp32 gradient copy; 131 GB at full depth, fraction 1)")
_T0 = time.perf_counter()


def _say(msg: str) -> None:
    print(f"[actor_bench {time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# Exact per-tensor fingerprints computed on the device: the weight sync's (rlk.rl.sync).
from rlk.integrations.megatron.native import NativeActor  # noqa: E402
from rlk.rl.sync import tensor_fingerprint as _fingerprint  # noqa: E402


def _config(a):
    from rlk.models.qwen3 import Qwen3Config

    return Qwen3Config.named(a.config, num_hidden_layers=a.layers)


def _weights(cfg, a):
    from rlk.models.qwen3 import random_weights

    return random_weights(cfg, a.seed, device=a.device, recipe=a.recipe)


def _setup(a):
    """(cfg, hf, packed batch, token_loss, rlk strict model)."""
    from rlk.models.qwen3 import Qwen3
    from rlk.replay import trainer
    from rlk.rl import grpo

    cfg = _config(a)
    hf = _weights(cfg, a)
    ids = torch.randint(0, cfg.vocab_size, (a.seqs, a.seq_len), generator=torch.Generator().manual_seed(a.seed + 1))
    p = a.seq_len // 2
    pk = trainer.pack([r[:p].tolist() for r in ids], [r[p:].tolist() for r in ids], device=a.device)
    m = Qwen3(cfg, hf, "strict")
    old, _ = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=False, host_cu=pk.host_cu)
    adv = torch.randn(pk.ids.shape[0], generator=torch.Generator().manual_seed(7)).to(a.device)
    loss = grpo.token_loss_fn(old, adv, pk.loss_mask, 0.2, int(pk.loss_mask.sum()))
    return cfg, hf, pk, loss, m


def _rlk_reference(cfg, m, pk, loss):
    """rlk's trainer: (logp [T], bf16 gradients by megatron name)."""
    from rlk.models.qwen3.layouts import fused_to_megatron

    lp, g = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=True, token_loss=loss, host_cu=pk.host_cu)
    return lp, fused_to_megatron(cfg, g)


def _vs_rlk(logp, grads, lp_rlk, ref) -> dict:
    from rlk.integrations.megatron.actor_probe import _diff

    if set(grads) != set(ref):
        raise RuntimeError(f"vs rlk: names differ: {sorted(set(grads) ^ set(ref))}")
    per = {k: _diff(g, ref[k].float()) for k, g in grads.items()}
    body = {k: v["differ"] for k, v in per.items() if k != LM_HEAD}
    return {"logp": _diff(logp, lp_rlk), "grads": {
        "tensors": len(body), "differing_tensors": sum(1 for v in body.values() if v),
        "differing_elements": sum(body.values()), "per_tensor_differing_elements": body},
        "lm_head_fp32_vs_rlk_bf16": per[LM_HEAD],
        "lm_head_bf16_rounding": _diff(grads[LM_HEAD].to(torch.bfloat16), ref[LM_HEAD])}


# ---- timing --------------------------------------------------------------------------------------
def _timed(fwd_bwd, opt_step, device) -> dict:
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    fwd_bwd()
    sync()
    t1 = time.perf_counter()
    opt_step()
    sync()
    t2 = time.perf_counter()
    out = {"seconds": {"fwd_bwd": round(t1 - t0, 4), "optimizer": round(t2 - t1, 4), "step": round(t2 - t0, 4)}}
    if cuda:
        out.update(peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3),
                   peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 3))
    out["peak_host_rss_gib"] = _host_rss_peak_gib()
    return out


def _host_rss_peak_gib(who: int = resource.RUSAGE_SELF) -> float:
    """The peak resident set of this process (or its largest waited-for child) since it started,
    GiB (Linux reports ``ru_maxrss`` in KiB)."""
    return round(resource.getrusage(who).ru_maxrss / 2**20, 3)


def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# ---- strict ------------------------------------------------------------------------------------
def _strict(cfg, hf, pk, loss, a, on_grads=None):
    """The strict actor's step 1: ``(actor, fingerprints, on_grads(logp, main_grads) result,
    fingerprints of the loaded weights)``."""
    from rlk.integrations.megatron.actor import MegatronActor
    from rlk.kernels.common import host_validated

    actor = MegatronActor(cfg, hf, lr=LR, recompute=a.recompute, device=a.device, optimizer_offload=a.optimizer_offload)
    params = dict(actor.model.named_parameters())
    loaded = {k: _fingerprint(p) for k, p in params.items()}
    with host_validated():
        (logp,) = actor.forward_backward([(pk, loss)])
    grads = {k: p.main_grad for k, p in params.items()}
    fps = {"logp": _fingerprint(logp), **{f"grad/{k}": _fingerprint(g) for k, g in grads.items()}}
    extra = on_grads(logp, grads) if on_grads is not None else None
    actor.step()
    fps.update({f"weight/{k}": _fingerprint(p) for k, p in params.items()})
    return actor, fps, extra, loaded


def _worker_fingerprints(a) -> dict:
    cfg, hf, pk, loss, m = _setup(a)
    del m
    actor, fps, _, _ = _strict(cfg, hf, pk, loss, a)
    _say(f"worker: step 1 fingerprinted ({len(fps)} tensors)")
    return fps


def _run_worker(a) -> dict:
    """Step 1's fingerprints from a fresh interpreter (this module with ``--worker``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "worker.json")
        argv = [sys.executable, "-m", "rlk.integrations.megatron.actor_bench", "--worker", path] + _args_of(a)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, timeout=a.worker_timeout)
        if p.returncode != 0:
            raise RuntimeError(f"actor_bench worker failed (rc {p.returncode}):\n{p.stdout[-3000:]}")
        with open(path) as f:
            return json.load(f)


# ---- the run -----------------------------------------------------------------------------------
def run(a) -> dict:
    from rlk.integrations.megatron.offload import optimizer_placement

    failures: list[str] = []
    checks: dict[str, bool] = {}
    _say(f"run to run: step 1 in a fresh process ({a.config}, {a.layers} layers, {a.seqs}x{a.seq_len}, {a.device})")
    other = _run_worker(a)
    worker_rss = _host_rss_peak_gib(resource.RUSAGE_CHILDREN)
    cfg, hf, pk, loss, m = _setup(a)
    lp_rlk = ref = None
    if not a.skip_rlk_reference:
        _say("rlk trainer: reference logp and gradients")
        lp_rlk, ref = _rlk_reference(cfg, m, pk, loss)
    del m
    _free(a.device)
    _say("strict: step 1 (compiles)" + ("" if ref is None else " and comparison with rlk's trainer"))
    actor, fps, (strict_logp, vs), loaded = _strict(
        cfg, hf, pk, loss, a,
        on_grads=lambda lp, g: (lp.clone(), None if ref is None else _vs_rlk(lp, g, lp_rlk, ref)))
    if vs is None:
        vs = {"skipped": "--skip-rlk-reference (rlk's trainer keeps every layer's activations: module docstring, "
                         "Memory)"}
    del hf, ref, lp_rlk
    _say("strict: step 2 (timed)")
    strict = _timed(lambda: actor.forward_backward([(pk, loss)]), actor.step, a.device)
    strict["optimizer"] = actor.optimizer_placement()
    del actor
    _free(a.device)
    diff_names = sorted(k for k in fps if other.get(k) != fps[k]) + sorted(set(other) - set(fps))
    rtr = {"tensors": len(fps), "differing_tensors": len(diff_names), "differing": diff_names[:20]}
    checks["run_to_run_equal"] = not diff_names
    if "skipped" not in vs:
        checks["logp_equal_rlk"] = vs["logp"]["differ"] == 0
        checks["grads_equal_rlk"] = vs["grads"]["differing_tensors"] == 0
        checks["lm_head_bf16_rounding_equal_rlk"] = vs["lm_head_bf16_rounding"]["differ"] == 0
    native, ratios, nvs = {"skipped": "--skip-native"}, None, None
    if not a.skip_native:
        _say("native: build megatron-core local-spec GPTModel, step 1")
        try:
            nat = NativeActor(cfg, _weights(cfg, a), device=a.device, recompute=a.recompute,
                              optimizer_offload=a.optimizer_offload, lr=LR)
            same = sorted(k for k, p in nat.model.named_parameters() if _fingerprint(p) != loaded.get(k))
            checks["native_weights_equal_strict"] = not same
            lp = nat.forward_backward(pk, loss, a.seqs, a.native_micro_batches)
            nat.step()
            d = (lp.float() - strict_logp.float()).abs()
            nvs = {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
                   "differing": int((lp != strict_logp).sum()), "tokens": int(lp.numel()),
                   "weights_differing_from_strict": same[:20]}
            # Loose on purpose (a sanity check of the weight mapping, not an exactness claim): native
            # rounds its logits to bf16 before the fp32 cross entropy; tiny (2 layers) gives 0.025.
            checks["native_logp_close_to_strict"] = bool(torch.isfinite(lp).all()) and nvs["mean_abs_diff"] < 0.5
            _say("native: step 2 (timed)")
            native = _timed(lambda: nat.forward_backward(pk, loss, a.seqs, a.native_micro_batches), nat.step, a.device)
            native["optimizer"] = optimizer_placement(nat.optimizer)
            del nat
        except Exception as e:  # reported, not raised: the strict results are still written
            import traceback

            native = {"error": repr(e)[:2000], "traceback": traceback.format_exc()[-4000:]}
            checks["native_ran"] = False
        _free(a.device)
        if "seconds" in native:
            s, n = strict["seconds"], native["seconds"]
            ratios = {"fwd_bwd": round(s["fwd_bwd"] / n["fwd_bwd"], 3), "step": round(s["step"] / n["step"], 3)}
            if "peak_allocated_gib" in native:
                ratios["peak_allocated"] = round(strict["peak_allocated_gib"] / native["peak_allocated_gib"], 3)
                ratios["peak_reserved"] = round(strict["peak_reserved_gib"] / native["peak_reserved_gib"], 3)
    failures = [k for k, ok in checks.items() if not ok]
    _say("done: " + ("passed" if not failures else f"FAILED {failures}"))
    return {"spec": {"config": a.config, "layers": a.layers, "seqs": a.seqs, "seq_len": a.seq_len,
                     "tokens": int(pk.ids.shape[0]), "prompt_len": a.seq_len // 2, "recompute": a.recompute,
                     "recipe": a.recipe, "seed": a.seed, "device": a.device, "lr": LR,
                     "reason_reduced_depth": REASON_DEPTH_OFFLOAD if a.optimizer_offload else REASON_REDUCED_DEPTH,
                     "optimizer_offload": a.optimizer_offload, "optimizer_states": _states_at(a),
                     "micro_batches": {"strict": 1, "native": a.native_micro_batches},
                     "rlk_reference": not a.skip_rlk_reference, "model_config": cfg.to_dict()},
            "strict": strict, "native": native, "strict_vs_native": ratios,
            "strict_vs_native_note": "ratios are strict / native (> 1: strict slower or larger)",
            "native_vs_strict_logp": nvs,
            "run_to_run": rtr, "vs_rlk_trainer": vs, "checks": checks, "passed": not failures,
            "peak_host_rss_gib": {"main": _host_rss_peak_gib(), "worker": worker_rss},
            "failures": failures, "provenance": _provenance(a), "versions": _versions(),
            "seconds_total": round(time.perf_counter() - _T0, 1)}


def _states_at(a) -> str:
    """Where both arms keep the fp32 main parameters and Adam moments."""
    if not a.optimizer_offload:
        return "device (megatron DistributedOptimizer, torch AdamW)"
    where = ("host" if a.optimizer_offload >= 1.0
             else f"host for {a.optimizer_offload:g} of the parameters, device for the rest")
    return f"{where} (megatron HybridDeviceOptimizer under the DistributedOptimizer, torch AdamW)"


def _provenance(a) -> dict:
    try:
        from rlk.integrations.megatron import spec, version
        from rlk.provenance import capability_record

        return capability_record("strict", contract_ids=sorted(set(spec.CONTRACTS.values())), load_contracts=False,
                                 extra={"engine": "megatron-core", "engine_version": version(),
                                        "pattern": "megatron_actor_bench", "config": a.config, "layers": a.layers})
    except Exception as e:  # the report is still written
        return {"error": repr(e)}


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("torch", "triton", "megatron-core"):
        try:
            out[name] = metadata.version(name)
        except Exception as e:
            out[name] = repr(e)
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = torch.version.cuda
    return out


def _parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--config", default="qwen3-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--recompute", default="full", choices=["full", "selective", "none"])
    ap.add_argument("--recipe", default="calibrated.v1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--optimizer-offload", type=float, nargs="?", const=1.0, default=0.0, metavar="FRACTION",
                    help="megatron's CPU offload of the fp32 main params and Adam moments, both arms (no value: all)")
    ap.add_argument("--skip-rlk-reference", action="store_true",
                    help="leave out the comparison with rlk's trainer (it does not fit at full depth and 32k tokens)")
    ap.add_argument("--skip-native", action="store_true")
    ap.add_argument("--native-micro-batches", type=int, default=1, metavar="N",
                    help="native arm: the batch in N micro-batches (megatron's micro_batch_size = seqs / N), "
                         "as its users fit a batch whose materialized logits do not fit at once; strict: one")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tag")
    ap.add_argument("--worker-timeout", type=float, default=900.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # step 1's fingerprints to this JSON file
    return ap


def _device_tag(device: str) -> str:
    """``h100`` / ``h200`` from the GPU's name, ``cuda`` for another GPU, ``cpu``."""
    if torch.device(device).type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(torch.device(device)).lower()
    return next((t for t in ("h200", "h100") if t in name), "cuda")


def _args_of(a) -> list[str]:
    return ["--config", a.config, "--layers", str(a.layers), "--seqs", str(a.seqs), "--seq-len", str(a.seq_len),
            "--recompute", a.recompute or "none", "--recipe", a.recipe, "--seed", str(a.seed), "--device", a.device,
            "--optimizer-offload", repr(a.optimizer_offload)]


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    a.recompute = None if a.recompute == "none" else a.recompute
    if a.native_micro_batches < 1 or a.seqs % a.native_micro_batches:
        ap.error(f"--native-micro-batches {a.native_micro_batches}: must divide --seqs {a.seqs}")
    if not 0.0 <= a.optimizer_offload <= 1.0:
        ap.error(f"--optimizer-offload {a.optimizer_offload}: a fraction in (0, 1] (no value: 1)")
    if a.worker:
        fps = _worker_fingerprints(a)
        with open(a.worker, "w") as f:
            json.dump(fps, f)
        return 0
    if not a.out:
        ap.error("--out is required")
    tag = a.tag or _device_tag(a.device)
    try:
        res = run(a)
    except Exception as e:  # a report is written even when a phase fails (e.g. out of memory)
        import traceback

        _say(f"FAILED: {e!r}"[:500])
        res = {"error": repr(e)[:2000], "traceback": traceback.format_exc()[-6000:], "passed": False,
               "failures": ["run raised"], "strict": None, "native": {}, "versions": _versions()}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"megatron_actor_{tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    print(json.dumps({"out": path, "passed": res["passed"], "failures": res["failures"], "strict": res["strict"],
                      "native": {k: v for k, v in (res["native"] or {}).items() if k != "traceback"}}))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
