"""Frozen replay with the megatron-core trainer: rlk's strict rollout records a fixture, the strict
megatron-core ``GPTModel`` (this package's spec, TP=1, in this process) re-scores it.

    python -m rlk.integrations.megatron.replay_probe --out DIR [--config qwen3-8b] [--layers N]
        [--sequences N] [--quick] [--device cuda|cpu] [--microbatch-tokens N] [--no-native]

1. Record: rlk's rollout executor (``rlk.replay.harness.record``, strict route) on random bf16
   weights (seed 0) with the workload of :mod:`rlk.replay.h200` (``FULL``; ``QUICK`` with
   ``--quick``) on CUDA; on CPU the tiny config, a small workload (:data:`CPU`) and the Triton
   interpreter. The fixture is saved to ``DIR/fixture/`` and loaded back: every arm scores the
   frozen artifact.
2. megatron-core: ``spec.build_gpt_model`` (rlk in every slot) from the rollout model's own
   fused weights (``layouts.fused_to_megatron`` -> ``weights.shard``, exact copies), prompt +
   response packed (``thd``, ``PackedSeqParams``) in micro-batches of whole sequences of at most
   ``microbatch_tokens`` tokens, selected-token logp from ``logp.output_processor``, reference
   mode (``torch.no_grad``). The post-build audit runs at build; the forward dispatch audit on
   one short sequence after scoring.
3. Compare (``rlk.replay.compare.compare_logp``, raw fp32 bytes) with the recorded rollout logp
   (the headline), and with rlk's own strict trainer pattern (``harness.check(fx, "strict")``).
4. Native arm: ``rlk.integrations.megatron`` has no native megatron-core arm (megatron's local
   ``DotProductAttention`` rejects packed ``thd`` sequences), so the native figures are rlk's
   native-route trainer (``harness.check(fx, "native")``, torch ops) on the same fixture,
   weights and micro-batches, compared with the strict rollout; the JSON says so.
5. Writes ``DIR/replay_megatron_h200.json``: provenance (``capability_record`` with
   ``trainer_engine`` / ``megatron_core_version``), model, workload, sequences,
   compared_elements, mismatch_count, max_abs_diff, torch_equal, trainer_engine,
   megatron_core_version, rlk_trainer {...}, native {...}, forward_audit, seconds, command.

Exit status 0 when the megatron-core trainer's mismatch_count is 0 and the forward audit passed.

Determinism: the strict contracts of :data:`rlk.integrations.megatron.spec.CONTRACTS` on both
sides (rollout: paged attention and decode; trainer: packed varlen rows); every row's bytes are
independent of batch composition and micro-batching, so equality is expected bit for bit.
Under the CPU interpreter this shows routing and fixed orders, not a GPU bf16 property.

Needs megatron-core (0.19.2: ``ci/setup_megatron.sh``, or the carried wheel on the H200).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rlk import determinism

# Small CPU workload (tiny config, Triton interpreter): the same code path as the H200 run.
CPU = dict(config="tiny", sequences=4, prompt_range=(3, 20), response_range=(2, 12), max_batch=4, chunk_size=16,
           token_budget=None, arrival_spread=6, microbatch_tokens=40)

NATIVE_NOTE = ("rlk.integrations.megatron has no native megatron-core arm (megatron's local DotProductAttention "
               "rejects packed thd sequences): these are rlk's native-route trainer "
               "(rlk.models.qwen3.Qwen3(route='native').trainer_logp, torch ops) on the same fixture, weights and "
               "micro-batches, compared with the strict rollout")


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def megatron_version() -> str:
    """The installed megatron-core version; raises ``RuntimeError`` naming the fix when it is missing."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"megatron-core is not importable ({e}): install megatron-core==0.19.2 "
                           "(ci/setup_megatron.sh; on the H200 pip install the carried wheel with "
                           "--no-deps)") from e
    from rlk.integrations.megatron import version

    v = version()
    if v is None:  # importable without package metadata (a bare source tree on the path)
        raise RuntimeError("megatron-core imports but has no package metadata: install it with pip "
                           "(ci/setup_megatron.sh)")
    return v


def _check_device(device: str) -> None:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: no CUDA device is visible (use --device cpu for the interpreter run)")
        if determinism.interpreter_active():
            raise RuntimeError("--device cuda with TRITON_INTERPRET set: unset it (the interpreter is for CPU runs)")
    elif device == "cpu":
        if not determinism.interpreter_active():
            if any(m.startswith("rlk.kernels.") for m in sys.modules):
                raise RuntimeError("--device cpu needs TRITON_INTERPRET=1 before any rlk kernel module is imported "
                                   "(run through the CLI, or set it in the test environment)")
            determinism.configure_cpu_interpreter()
    else:
        raise RuntimeError(f"--device {device!r}: expected cuda or cpu")


def params(device: str, quick: bool = False, sequences: int | None = None, config: str | None = None,
           microbatch_tokens: int | None = None) -> dict:
    """The workload: ``rlk.replay.h200.FULL`` / ``QUICK`` on CUDA, :data:`CPU` on CPU; overrides last."""
    if device == "cuda":
        from rlk.replay import h200

        p = dict(h200.QUICK if quick else h200.FULL)
    else:
        p = dict(CPU)
    if sequences:
        p["sequences"] = sequences
    if config:
        p["config"] = config
    if microbatch_tokens:
        p["microbatch_tokens"] = microbatch_tokens
    return p


def microbatches(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Consecutive groups of whole sequences (request order) of at most ``budget`` tokens; a longer
    sequence is a group of its own (as ``rlk.replay.trainer``'s micro-batches)."""
    groups, cur, tok = [], [], 0
    for i, L in enumerate(lengths):
        if cur and budget and tok + L > budget:
            groups.append(cur)
            cur, tok = [], 0
        cur.append(i)
        tok += L
    if cur:
        groups.append(cur)
    return groups


def build_megatron(cfg, fused: dict, device: str, cpu_init: bool = False):
    """The strict GPTModel at TP=1 on ``device`` holding exactly ``fused`` (rlk's fused layout).

    torch.distributed (gloo on CPU, nccl with CUDA; one process) and megatron's parallel state are
    initialized as ``harness.megatron_logp`` does (``spec.init_parallel``); on CUDA megatron's
    model-parallel RNG is seeded too. Parameters are allocated on ``device`` without an init
    (``perform_initialization=False``; ``cpu_init``: on the host, then moved) and every one is
    overwritten by ``weights.load_into`` (fail closed: all covered, shapes and dtypes equal).
    """
    import torch

    from rlk.integrations.megatron import spec, weights
    from rlk.models.qwen3.layouts import fused_to_megatron

    spec.init_parallel(1)
    if device == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(0)
    model = spec.build_gpt_model(cfg, 1, use_cpu_initialization=(device == "cpu" or cpu_init),
                                 perform_initialization=False)
    model = model.to(torch.device(device))
    weights.load_into(model, weights.shard(cfg, fused_to_megatron(cfg, fused), 1, 0))
    model.eval()
    return model


def _packed_params(pk, max_seqlen: int):
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = pk.cu_seqlens.to(torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max_seqlen,
                           max_seqlen_kv=max_seqlen)


def _forward(model, pk):
    """Selected-token logp ``[T]`` fp32 of one packed micro-batch (reference mode)."""
    import torch

    from rlk.integrations.megatron.logp import output_processor

    T = pk.ids.shape[0]
    ms = max(p + r for p, r in zip(pk.prompt_lens, pk.response_lens))
    with torch.no_grad():
        lp = model(pk.ids.view(1, T), None, None, labels=pk.targets.view(1, T),
                   packed_seq_params=_packed_params(pk, ms), output_processor=output_processor,
                   output_processor_context={})
    return lp.view(T)


def megatron_score(model, cfg, prompts, responses, microbatch_tokens: int | None, device: str):
    """Response logp per request (list of ``[r]`` fp32) from the megatron-core model, micro-batched;
    returns ``(logp, seconds, number of micro-batches)``. Ids and lengths are checked on the
    host, so launches run under ``host_validated`` (as ``rlk.replay.trainer.score``)."""
    import torch

    from rlk.errors import UnsupportedConfigError
    from rlk.kernels.common import host_validated
    from rlk.replay import trainer
    from rlk.replay.rollout import check_tokens

    check_tokens(cfg.vocab_size, prompts, responses)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    if max(lengths, default=0) > cfg.max_position_embeddings:
        raise UnsupportedConfigError(f"a sequence of {max(lengths)} tokens exceeds max_position_embeddings "
                                     f"{cfg.max_position_embeddings}")
    n = len(prompts)
    groups = microbatches(lengths, microbatch_tokens)
    out: list = [None] * n
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with host_validated():
        for g in groups:
            pk = trainer.pack(prompts, responses, g, device=device)
            lp = _forward(model, pk)
            for i, t in enumerate(trainer.response_logp(pk, lp, n)):
                if t is not None:
                    out[i] = t
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0, len(groups)


def forward_audit(model, prompts, responses, device: str) -> dict:
    """The dispatch audit (``audit.forward_audit``) over the shortest sequence: no floating-point
    aten compute outside rlk ops. Returns ``{"passed", "sequence", "tokens", "error"?}``."""
    from rlk.integrations.megatron import audit
    from rlk.replay import trainer

    i = min(range(len(prompts)), key=lambda j: len(prompts[j]) + len(responses[j]))
    pk = trainer.pack(prompts, responses, [i], device=device)
    rec = {"sequence": i, "tokens": int(pk.ids.shape[0])}
    try:
        with audit.forward_audit() as mode:
            _forward(model, pk)
        rec["passed"] = True
        rec["ops_seen"] = dict(sorted(mode.seen.items()))
    except audit.StrictAuditError as e:
        rec["passed"] = False
        rec["error"] = str(e)
    return rec


def _provenance(version: str, cfg_name: str) -> dict:
    import torch

    from rlk.integrations.megatron import spec

    extra = {"trainer_engine": "megatron-core", "megatron_core_version": version, "model": cfg_name,
             "pattern": "trainer (megatron-core) vs rollout (rlk)"}
    try:
        from rlk.provenance import capability_record

        return capability_record("strict", contract_ids=sorted(set(spec.CONTRACTS.values())), extra=extra)
    except Exception as e:  # provenance is recorded, never invented
        import triton

        return {"error": f"capability_record unavailable: {type(e).__name__}: {e}", "extra": extra,
                "torch": torch.__version__, "triton": triton.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _figures(c: dict) -> dict:
    return {k: c[k] for k in ("compared_elements", "mismatch_count", "max_abs_diff", "torch_equal")}


def run(out_dir: str, *, config: str | None = None, layers: int | None = None, sequences: int | None = None,
        quick: bool = False, device: str | None = None, microbatch_tokens: int | None = None, native: bool = True,
        cpu_init: bool = False, progress=_say, command: str | None = None) -> dict:
    """Record, re-score with megatron-core (and rlk's strict / native trainers), compare, write
    ``out_dir/replay_megatron_h200.json``; returns the summary (see the module docstring)."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    _check_device(device)
    version = megatron_version()
    determinism.apply_strict_env()

    from rlk.integrations.megatron import spec as mspec
    from rlk.replay import compare, fixture, h200, harness

    if version != mspec.MEGATRON_VERSION:
        progress(f"WARNING: megatron-core {version}; the strict spec was written against {mspec.MEGATRON_VERSION}")
    p = params(device, quick, sequences, config, microbatch_tokens)
    os.makedirs(out_dir, exist_ok=True)
    t_all = time.perf_counter()
    spec = harness.ModelSpec(config=p["config"], num_layers=layers, seed=0, device=device, dtype="bfloat16")
    cfg = spec.cfg()
    progress(f"model {cfg.name}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
             f"heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}x{cfg.head_dim}, vocab {cfg.vocab_size}; "
             f"device {device}; trainer engine megatron-core {version}")

    # 1. record (strict rollout), save, load back (the frozen fixture every arm scores)
    fx_rec, res, _reqs, rc = h200.record_frozen(spec, p, out_dir, progress)
    fx = fixture.load(os.path.join(out_dir, "fixture"))
    del fx_rec

    # 2. megatron-core: the same weights (the rollout model's fused tensors), packed scoring
    t0 = time.perf_counter()
    fused = harness.build_model(harness.spec_of(fx, device), "strict").w
    model = build_megatron(cfg, fused, device, cpu_init=cpu_init)
    if device == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    n_params = sum(t.numel() for t in model.parameters())
    progress(f"megatron-core GPTModel (strict spec, TP=1) built and loaded: {n_params / 1e6:.1f} M parameters, "
             f"{build_s:.1f} s")
    weights_check = {"method": "weights.load_into: every parameter copied exactly from the rollout model's tensors"}
    if n_params < 50_000_000:
        from rlk.integrations.megatron import weights
        from rlk.models.qwen3.weights import weights_sha256

        sha = weights_sha256(weights.megatron_to_hf(cfg, [weights.state_of(model)]))
        weights_check.update(sha256_hf=sha, equals_fixture=sha == fx.meta["weights"].get("sha256_hf"))
    meg_lp, meg_s, n_mb = megatron_score(model, cfg, fx.prompts, fx.responses, p["microbatch_tokens"], device)
    meg = compare.compare_logp(meg_lp, fx.rollout_logp, fx.prompt_lens, ("megatron", "rollout"))
    progress(f"megatron-core trainer vs strict rollout: mismatch_count={meg['mismatch_count']} of "
             f"{meg['compared_elements']}, max_abs_diff={meg['max_abs_diff']}, torch_equal={meg['torch_equal']} "
             f"({n_mb} micro-batches, {meg_s:.1f} s)")
    audit_rec = forward_audit(model, fx.prompts, fx.responses, device)
    progress(f"forward dispatch audit ({audit_rec['tokens']} tokens): "
             + ("passed" if audit_rec["passed"] else f"FAILED: {audit_rec['error']}"))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    # 3. rlk's own strict trainer pattern (for information)
    strict = harness.check(fx, "strict", device=device, replay_rollout=False,
                           microbatch_tokens=p["microbatch_tokens"], progress=progress)
    s = strict["trainer_vs_recorded"]
    meg_vs_rlk = compare.compare_logp(meg_lp, strict["_trainer_logp"], fx.prompt_lens, ("megatron", "rlk_trainer"))
    progress(f"rlk strict trainer vs rollout: mismatch_count={s['mismatch_count']}; megatron-core vs rlk trainer: "
             f"mismatch_count={meg_vs_rlk['mismatch_count']} ({strict['trainer_seconds']:.1f} s)")

    # 4. native arm
    nat_rec, nat_s = None, None
    if native:
        nat = harness.check(fx, "native", device=device, replay_rollout=False,
                            microbatch_tokens=p["microbatch_tokens"], progress=progress)
        nat_s = nat["trainer_seconds"]
        n = compare.compare_logp(nat["_trainer_logp"], fx.rollout_logp, fx.prompt_lens, ("native", "rollout"))
        nat_rec = {"arm": "rlk native-route trainer", "note": NATIVE_NOTE, **_figures(n),
                   "vs_megatron_strict": _figures(compare.compare_logp(nat["_trainer_logp"], meg_lp, fx.prompt_lens,
                                                                       ("native", "megatron"))),
                   "seconds": nat_s}
        progress(f"native arm (rlk native-route trainer) vs strict rollout: mismatch_count={n['mismatch_count']} "
                 f"of {n['compared_elements']}, max_abs_diff={n['max_abs_diff']:.3g} ({nat_s:.1f} s)")

    cmd = command or ("python -m rlk.integrations.megatron.replay_probe --out DIR" + (f" --config {config}" if config else "")
                      + (f" --layers {layers}" if layers else "") + (f" --sequences {sequences}" if sequences else "")
                      + (" --quick" if quick else "") + f" --device {device}")
    summary = {
        "provenance": _provenance(version, cfg.name),
        "rollout_provenance_fingerprint": (fx.meta.get("provenance") or {}).get("fingerprint"),
        "trainer_engine": "megatron-core",
        "megatron_core_version": version,
        "trainer": {"engine": "megatron-core", "version": version, "model": "GPTModel",
                    "spec": "rlk.integrations.megatron.spec (rlk modules in every slot)", "tensor_parallel": 1,
                    "format": "thd (PackedSeqParams)", "mode": "reference (torch.no_grad)",
                    "logp": "rlk.integrations.megatron.logp.output_processor",
                    "microbatch_tokens": p["microbatch_tokens"], "microbatches": n_mb,
                    "parameters": n_params, "weights_check": weights_check},
        "reference": "rlk strict rollout pattern (rlk.replay.rollout), recorded fixture",
        "contracts": mspec.CONTRACTS,
        "device": device,
        "model": {"config": cfg.name, "num_hidden_layers": cfg.num_hidden_layers,
                  "layers_note": "all layers" if layers is None else f"{layers} of the published layers (for time)",
                  "weights": fx.meta["weights"], "dtype": "bfloat16"},
        "workload": {"sequences": len(fx.prompts), "prompt_range": p["prompt_range"],
                     "response_range": p["response_range"], "prompt_tokens": sum(fx.prompt_lens),
                     "response_tokens": sum(fx.response_lens), "rollout": rc.to_dict(), "rollout_steps": res.steps,
                     "composition_changes": res.composition_changes, "max_batch_seen": max(res.batch_sizes)},
        "sequences": meg["sequences"],
        **_figures(meg),
        "rlk_trainer": {"arm": "rlk strict trainer pattern (Qwen3(route='strict').trainer_logp)",
                        "vs_rollout": _figures(s), "megatron_vs_rlk_trainer": _figures(meg_vs_rlk)},
        "native": nat_rec,
        "forward_audit": audit_rec,
        "seconds": {"rollout_strict": res.seconds, "megatron_build": build_s, "trainer_megatron": meg_s,
                    "trainer_rlk_strict": strict["trainer_seconds"], "trainer_native": nat_s,
                    "total": time.perf_counter() - t_all},
        "command": cmd,
    }
    if "first_mismatch" in meg:
        summary["first_mismatch"] = meg["first_mismatch"]
    if device == "cpu" and determinism.interpreter_active():
        summary["note"] = ("CPU Triton interpreter (bf16 loads, fp32 dot operands): shows routing and fixed "
                           "orders, not a GPU bf16 property")
    path = os.path.join(out_dir, "replay_megatron_h200.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    progress(f"wrote {path} (total {summary['seconds']['total']:.1f} s)")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlk.integrations.megatron.replay_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for replay_megatron_h200.json and fixture/")
    ap.add_argument("--config", default=None, help="qwen3-8b on CUDA, tiny on CPU by default")
    ap.add_argument("--layers", type=int, default=None, help="default: all layers of the config")
    ap.add_argument("--sequences", type=int, default=None, help="default: 64 (16 with --quick) on CUDA, 4 on CPU")
    ap.add_argument("--quick", action="store_true", help="rlk.replay.h200.QUICK's shorter sequences (CUDA)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when visible")
    ap.add_argument("--microbatch-tokens", type=int, default=None, help="default: 16384 on CUDA, 40 on CPU")
    ap.add_argument("--no-native", action="store_true", help="skip the native arm")
    ap.add_argument("--cpu-init", action="store_true", help="allocate megatron's parameters on the host, then move")
    a = ap.parse_args(argv)
    if a.device == "cpu":  # before any kernel module is imported
        determinism.configure_cpu_interpreter()
    else:
        determinism.configure_cpu_interpreter_without_gpu()
    cmd = "python -m rlk.integrations.megatron.replay_probe " + " ".join(sys.argv[1:] if argv is None else argv)
    s = run(a.out, config=a.config, layers=a.layers, sequences=a.sequences, quick=a.quick, device=a.device,
            microbatch_tokens=a.microbatch_tokens, native=not a.no_native, cpu_init=a.cpu_init, command=cmd)
    print(json.dumps({k: s[k] for k in ("trainer_engine", "megatron_core_version", "sequences", "compared_elements",
                                        "mismatch_count", "max_abs_diff", "torch_equal")}))
    import torch.distributed as dist

    if dist.is_initialized():  # the CLI's own single-process group (run() leaves it to its caller)
        dist.destroy_process_group()
    return 0 if s["mismatch_count"] == 0 and s["forward_audit"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
