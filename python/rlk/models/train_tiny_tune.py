"""Trains a small Qwen3 config byte-level on CPU: the trained fixtures of the CPU tests.

    python -m rlk.models.train_tiny_tune            # tiny: about 5 minutes on a shared 2-core CPU (1 thread)
    python -m rlk.models.train_tiny_tune --config tiny-hd64 --steps 300   # head_dim 64 (vLLM CPU check)

writes the checkpoint ``python/rlk/models/qwen3/<stem>/{model.safetensors,config.json}`` (bf16,
Hugging Face names; load it with :func:`rlk.models.qwen3.trained.trained_weights`) and
``docs/results/<stem>.{json,png}`` (corpus, command, steps, losses, entropy statistics, sha256),
where ``<stem>`` is :func:`rlk.models.qwen3.trained.trained_stem` (``tiny_trained``,
``tiny_hd64_trained``). ``--out DIR`` writes all four files under ``DIR`` instead.

* Corpus (:func:`rlk.models.byte_corpus.stdlib_corpus`): the top-level ``*.py`` files of the running Python's standard
  library, sorted by name; every tenth file (index % 10 == 5) is held out for validation; each
  part is concatenated and cut to a fixed byte budget. Nothing is downloaded. The text differs
  between Python versions, so the corpus sha256 is recorded and a run whose corpus hash differs
  from the recorded one stops (``--allow-corpus-change`` proceeds and records the new hash).
* Tokens are bytes (vocabulary 256 = the trained configs').
* The forward is rlk's own model code (:class:`rlk.models.qwen3.Qwen3` on the ``native`` route,
  fp32 weights as autograd leaves), with one difference: attention runs batched over the
  equal-length windows (one SDPA call) instead of the route's per-sequence loop, whose slice
  backward costs O(batch^2). After training, the saved bf16 checkpoint is reloaded and scored
  with ``Qwen3.trainer_logp`` on the native route (and the strict route on a few tokens) to
  check that the file is the model rlk runs.
* Deterministic on one machine: seeded init and batches, ``torch.use_deterministic_algorithms``,
  a fixed thread count (``--threads``, default 1: 2 threads stall when another process holds a
  core; runs with 1 and 2 threads gave the same losses here, but float reductions may group
  differently with another count).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

from rlk.models.byte_corpus import (CORPUS_NAME, TRAIN_BYTES, VAL_BYTES, Corpus,  # noqa: F401 (tests use tt.*)
                                    check_corpus, stdlib_corpus)
from rlk.models.qwen3.config import CONFIG_DIR, Qwen3Config
from rlk.models.qwen3.trained import TRAINED, trained_path, trained_stem

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
RESULTS_DIR = os.path.join(REPO, "docs", "results")


def outputs(name: str = "tiny", out: str | None = None) -> tuple[str, str, str]:
    """``(checkpoint folder, record json, curve png)`` of config ``name``: the checked-in
    locations, or all three under ``out``."""
    stem = trained_stem(name)
    if out:
        return os.path.join(out, stem), os.path.join(out, stem + ".json"), os.path.join(out, stem + ".png")
    return trained_path(name), os.path.join(RESULTS_DIR, stem + ".json"), os.path.join(RESULTS_DIR, stem + ".png")


CHECKPOINT_DIR, RESULTS_JSON, _ = outputs("tiny")


@dataclasses.dataclass
class TrainConfig:
    steps: int = 1200
    batch: int = 16
    seq_len: int = 256
    lr: float = 4e-3
    min_lr_frac: float = 0.1  # cosine decay from lr to lr * min_lr_frac
    warmup: int = 100
    weight_decay: float = 0.1  # matrices only (not the norm weights)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 128  # validation windows of seq_len bytes, spread over the validation text
    threads: int = 1  # robust on a shared machine (2 threads stall when another process holds a core)
    max_minutes: float | None = None  # wall-clock stop (recorded; the step count then differs)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_frac + (1 - self.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def windows(data: bytes, seq_len: int, n: int) -> torch.Tensor:
    """``n`` windows of ``seq_len + 1`` bytes spread evenly over ``data`` (aligned to ``seq_len``,
    so they do not overlap; all of them when ``data`` holds no more): ``[n, seq_len + 1]`` int64."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    total = (t.numel() - 1) // seq_len
    n = min(n, total)
    return torch.stack([t[j * seq_len: j * seq_len + seq_len + 1] for j in (i * total // n for i in range(n))])


def batched_logp(model, w: dict, x: torch.Tensor) -> torch.Tensor:
    """Next-byte logp ``[B, S]`` of windows ``x [B, S+1]`` through rlk's layer code (``model._forward``)
    with fused weights ``w`` and one causal SDPA call over the ``B`` equal-length windows."""
    B, S = x.shape[0], x.shape[1] - 1
    ids, tgt = x[:, :-1].reshape(-1), x[:, 1:].reshape(-1)
    positions = torch.arange(S).repeat(B)

    def attn(_layer, q, k, v):
        qb, kb, vb = (t.view(B, S, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=model.scale, enable_gqa=True)
        return o.transpose(1, 2).reshape(q.shape)

    h = model._forward(w, ids, positions, attn)
    return model.ops.logp(h, w["lm_head.weight"], tgt).view(B, S)


def train(cfg: Qwen3Config, corpus: Corpus, tc: TrainConfig, progress=print) -> dict:
    """Trains from ``random_weights(cfg, tc.seed)`` (fp32). Returns fused fp32 weights and the curve."""
    from rlk.models.qwen3 import Qwen3, random_weights
    from rlk.models.qwen3.layouts import hf_to_fused

    torch.manual_seed(tc.seed)
    torch.set_num_threads(tc.threads)
    torch.use_deterministic_algorithms(True)
    w = {k: t.clone().requires_grad_(True) for k, t in hf_to_fused(cfg, random_weights(cfg, tc.seed, torch.float32)).items()}
    model = Qwen3(cfg, w, "native")
    decay = [t for t in w.values() if t.ndim == 2]
    keep = [t for t in w.values() if t.ndim != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay}, {"params": keep, "weight_decay": 0.0}],
                            lr=tc.lr, betas=(tc.beta1, tc.beta2), foreach=False)
    data = torch.frombuffer(bytearray(corpus.train), dtype=torch.uint8).long()
    val = windows(corpus.val, tc.seq_len, tc.eval_windows)
    gen = torch.Generator().manual_seed(tc.seed)
    offs = torch.arange(tc.seq_len + 1)

    def evaluate():
        with torch.no_grad():
            return float(-batched_logp(model, w, val).mean())

    curve = {"step": [], "train": [], "val_step": [], "val": []}
    t0, step = time.perf_counter(), 0
    stopped_early = False
    for step in range(tc.steps):
        if step % tc.eval_every == 0:
            curve["val_step"].append(step)
            curve["val"].append(evaluate())
        starts = torch.randint(0, data.numel() - tc.seq_len - 1, (tc.batch,), generator=gen)
        x = data[starts[:, None] + offs]
        for g in opt.param_groups:
            g["lr"] = tc.lr_at(step)
        loss = -batched_logp(model, w, x).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), tc.grad_clip, foreach=False)
        opt.step()
        curve["step"].append(step)
        curve["train"].append(float(loss.detach()))
        elapsed = time.perf_counter() - t0
        if progress and (step % tc.eval_every == 0 or step == tc.steps - 1):
            last = curve["train"][-min(50, len(curve["train"])):]
            eta = elapsed / (step + 1) * (tc.steps - step - 1)
            progress(f"step {step + 1}/{tc.steps}  train {sum(last) / len(last):.3f}  val {curve['val'][-1]:.3f} nats/byte"
                     f"  {elapsed:.0f}s elapsed, ~{eta:.0f}s left")
        if tc.max_minutes is not None and elapsed > 60 * tc.max_minutes:
            stopped_early = step + 1 < tc.steps
            break
    wall = time.perf_counter() - t0
    curve["val_step"].append(step + 1)
    curve["val"].append(evaluate())
    return {"weights": {k: t.detach() for k, t in w.items()}, "curve": curve, "steps_run": step + 1,
            "stopped_early": stopped_early, "train_seconds": wall}


def logp_stats(lp: torch.Tensor) -> dict:
    lp = lp.float().flatten()
    q = torch.quantile(lp.double(), torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)).tolist()
    return {"n": lp.numel(), "mean": float(lp.mean()), "std": float(lp.std()), "p1": q[0], "p50": q[1], "p99": q[2],
            "frac_logp_zero": float((lp == 0.0).float().mean()), "any_nan": bool(torch.isnan(lp).any())}


def distribution_stats(model, text: bytes, *, windows_n: int = 16, seq_len: int = 256, prompts: int = 16,
                       prompt_len: int = 16, new_tokens: int = 128, seed: int = 0) -> dict:
    """Entropy of the next-byte distribution on ``text`` (teacher-forced, ``windows_n`` windows) and
    selected-token logp of bytes the model samples itself (``rlk.replay.rollout.run_rollout``, seeded
    Gumbel-max at temperature 1, the gate's sampler) from ``prompts`` prompts taken from ``text``."""
    from rlk.replay.rollout import Request, RolloutConfig, run_rollout

    x = windows(text, seq_len, windows_n)
    B, S = x.shape[0], seq_len
    cu = torch.arange(B + 1, dtype=torch.int32) * S
    with torch.no_grad():
        h = model._forward(model.w, x[:, :-1].reshape(-1), torch.arange(S).repeat(B),
                           lambda _i, q, k, v: model.ops.attn_varlen(q, k, v, cu, S, model.scale))
        logits, _ = model.logits_for_sampling(h)
        lsm = torch.log_softmax(logits.float(), -1)
        ent = -(lsm.exp() * lsm).sum(-1)
        nll = -lsm.gather(1, x[:, 1:].reshape(-1, 1))[:, 0]
    reqs = [Request(prompt=list(x[i % B, :prompt_len].tolist()), max_new_tokens=new_tokens) for i in range(prompts)]
    rc = RolloutConfig(max_batch=prompts, chunk_size=prompt_len, sample_seed=seed, jitter=0.0)
    res = run_rollout(model, reqs, rc)
    sampled = torch.cat([lp.float().cpu() for lp in res.logp])
    return {"route": model.route, "weights_dtype": str(model.dtype).replace("torch.", ""),
            "text_tokens": int(ent.numel()), "entropy_mean": float(ent.mean()), "entropy_p50": float(ent.median()),
            "text_nll": float(nll.mean()), "entropy_any_nan": bool(torch.isnan(ent).any()),
            "sampled_logp": logp_stats(sampled), "sampled_sequences": prompts, "sampled_per_sequence": new_tokens,
            "sample_seed": seed}


def healthy(stats: dict, vocab: int = 256) -> list[str]:
    """Reasons ``distribution_stats`` is outside the healthy band (empty when healthy)."""
    bad = []
    e = stats["entropy_mean"]
    if not 0.1 <= e <= 0.8 * math.log(vocab):
        bad.append(f"entropy_mean {e:.3f} nats outside [0.1, {0.8 * math.log(vocab):.3f}]")
    s = stats["sampled_logp"]
    if s["frac_logp_zero"] > 0.01:
        bad.append(f"frac_logp_zero {s['frac_logp_zero']:.4f} > 0.01")
    if stats["entropy_any_nan"] or s["any_nan"] or any(math.isnan(s[k]) for k in ("mean", "std", "p1", "p50", "p99")):
        bad.append("NaN in the statistics")
    return bad


def verify(cfg: Qwen3Config, ckpt_dir: str, corpus: Corpus, tc: TrainConfig, strict_tokens: int = 64) -> dict:
    """Scores the saved bf16 checkpoint with rlk's own model: the training forward vs
    ``Qwen3.trainer_logp`` (native route) on the same fp32-upcast weights, the bf16 native route,
    and the strict route on ``strict_tokens`` bytes (where Triton can run: GPU or interpreter)."""
    from rlk import determinism
    from rlk.models.qwen3 import Qwen3
    from rlk.models.qwen3.weights import load_safetensors

    wb = load_safetensors(ckpt_dir, cfg)
    x = windows(corpus.val, tc.seq_len, tc.eval_windows)
    B, S = x.shape[0], tc.seq_len
    ids, tgt = x[:, :-1].reshape(-1), x[:, 1:].reshape(-1)
    cu = torch.arange(B + 1, dtype=torch.int32) * S
    m32 = Qwen3(cfg, {k: v.float() for k, v in wb.items()}, "native")
    with torch.no_grad():
        ours = batched_logp(m32, m32.w, x).reshape(-1)
    rlk32 = m32.trainer_logp(ids, cu, tgt)[0]
    nat = Qwen3(cfg, wb, "native")
    lp_nat = nat.trainer_logp(ids, cu, tgt)[0]
    out = {"windows": B, "tokens": int(ids.numel()),
           "val_loss_bf16_weights_fp32_trainer_forward": float(-ours.mean()),
           "val_loss_bf16_weights_fp32_rlk_native": float(-rlk32.mean()),
           "max_abs_logp_diff_trainer_forward_vs_rlk_native_fp32": float((ours - rlk32).abs().max()),
           "val_loss_bf16_rlk_native": float(-lp_nat.mean()),
           "max_abs_logp_diff_rlk_native_bf16_vs_fp32": float((lp_nat - rlk32).abs().max())}
    if torch.cuda.is_available() or determinism.interpreter_active():
        n = strict_tokens
        cu1 = torch.tensor([0, n], dtype=torch.int32)
        lp_s = Qwen3(cfg, wb, "strict").trainer_logp(ids[:n], cu1, tgt[:n])[0].cpu()
        out["strict"] = {"tokens": n, "loss_rlk_strict": float(-lp_s.mean()),
                         "loss_rlk_native_bf16": float(-lp_nat[:n].mean()), "loss_fp32": float(-rlk32[:n].mean()),
                         "max_abs_logp_diff_vs_native_bf16": float((lp_s - lp_nat[:n]).abs().max()),
                         "max_abs_logp_diff_vs_fp32": float((lp_s - rlk32[:n]).abs().max())}
    else:
        out["strict"] = "not run: no GPU and the Triton interpreter is off"
    return out


def plot(curve: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([s + 1 for s in curve["step"]], curve["train"], lw=0.6, alpha=0.6, label="train (batch)")
    ax.plot(curve["val_step"], curve["val"], "o-", ms=3, label="validation")
    ax.axhline(math.log(256), color="gray", ls="--", lw=0.8, label="uniform, ln 256")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / byte)")
    ax.set_ylim(0, 6.5)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})  # no matplotlib version stamp: stable bytes
    plt.close(fig)


def _rel(path: str) -> str:
    p = os.path.abspath(path)
    return os.path.relpath(p, REPO) if p.startswith(REPO + os.sep) else p


def parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    ap = argparse.ArgumentParser(prog="python -m rlk.models.train_tiny_tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny", choices=TRAINED, help="named config to train (default tiny)")
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--seq-len", type=int, default=d.seq_len)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--eval-every", type=int, default=d.eval_every)
    ap.add_argument("--max-minutes", type=float, default=None, help="stop training after this wall time (recorded)")
    ap.add_argument("--out", default=None, help="folder for all outputs (default: the checked-in locations)")
    ap.add_argument("--allow-corpus-change", action="store_true",
                    help="train even when the corpus hash differs from the recorded one")
    return ap


def main(argv=None) -> int:
    from rlk import determinism

    determinism.configure_cpu_interpreter_without_gpu()  # for the strict-route check, before kernels load
    args = parser().parse_args(argv)
    tc = TrainConfig(steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr, seed=args.seed,
                     threads=args.threads, eval_every=args.eval_every, max_minutes=args.max_minutes)
    cfg = Qwen3Config.named(args.config)
    if tc.seq_len > cfg.max_position_embeddings:
        raise SystemExit(f"error: --seq-len {tc.seq_len} > max_position_embeddings {cfg.max_position_embeddings}")
    ckpt_dir, json_path, png_path = outputs(args.config, args.out)
    t_all = time.perf_counter()
    corpus = stdlib_corpus()
    for recorded in dict.fromkeys((outputs(args.config)[1], RESULTS_JSON)):  # one corpus for every config
        check_corpus(corpus, recorded, args.allow_corpus_change)
    print(f"corpus {corpus.name}: {len(corpus.train)} train / {len(corpus.val)} validation bytes, Python "
          f"{corpus.meta['python']}, sha256 {corpus.sha256[:16]}...", flush=True)
    res = train(cfg, corpus, tc, progress=lambda s: print(s, flush=True))

    from rlk.models.qwen3 import Qwen3
    from rlk.models.qwen3.layouts import fused_to_hf
    from rlk.models.qwen3.weights import file_sha256, load_safetensors, save_safetensors

    os.makedirs(ckpt_dir, exist_ok=True)
    hf = {k: v.to(torch.bfloat16) for k, v in fused_to_hf(cfg, res["weights"]).items()}
    ckpt = os.path.join(ckpt_dir, "model.safetensors")
    save_safetensors(hf, ckpt)
    shutil.copyfile(os.path.join(CONFIG_DIR, f"{args.config}.json"), os.path.join(ckpt_dir, "config.json"))
    print("checking the saved checkpoint with rlk's model (native; strict on a few tokens)...", flush=True)
    checks = verify(cfg, ckpt_dir, corpus, tc)
    stats = distribution_stats(Qwen3(cfg, load_safetensors(ckpt_dir, cfg), "native"), corpus.val, seed=tc.seed)
    curve = res["curve"]
    last = curve["train"][-50:]
    val = curve["val"][-1]
    losses = {"unit": "nats per byte", "init_val": curve["val"][0], "train_last50_mean": sum(last) / len(last),
              "val_fp32": val, "val_bits_per_byte": val / math.log(2),
              "val_bf16_rlk_native": checks["val_loss_bf16_rlk_native"],
              "val_bf16_rlk_native_bits_per_byte": checks["val_loss_bf16_rlk_native"] / math.log(2)}
    from rlk import provenance

    rec = {
        "what": f"byte-level training of the {args.config} Qwen3 config on CPU (the trained fixture of the CPU tests)",
        "command": " ".join(["python -m rlk.models.train_tiny_tune", *(argv if argv is not None else sys.argv[1:])]),
        "config": args.config,
        "corpus": corpus.meta,
        "train_config": dataclasses.asdict(tc),
        "steps": res["steps_run"],
        "stopped_early": res["stopped_early"],
        "tokens_seen": res["steps_run"] * tc.batch * tc.seq_len,
        "train_seconds": round(res["train_seconds"], 1),
        "total_seconds": round(time.perf_counter() - t_all, 1),
        "losses": losses,
        "entropy": stats,
        "healthy": healthy(stats, cfg.vocab_size) or "yes",
        "checks": checks,
        "checkpoint": {"path": _rel(ckpt), "sha256": file_sha256(ckpt), "bytes": os.path.getsize(ckpt),
                       "dtype": "bfloat16", "parameters": sum(v.numel() for v in hf.values())},
        "curve": {k: [round(v, 4) for v in vals] if k in ("train", "val") else vals for k, vals in curve.items()},
        "machine": {"cpu_count": os.cpu_count(), "torch_threads": tc.threads},
        "provenance": provenance.capability_record(route="native", contract_ids=[], load_contracts=False,
                                                   extra={"tool": "rlk.models.train_tiny_tune"}),
    }
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    plot(curve, png_path, f"{args.config} Qwen3, byte-level, {corpus.name} (Python {corpus.meta['python']})\n"
                          f"validation {val:.3f} nats = {val / math.log(2):.3f} bits per byte after {res['steps_run']} steps")
    s = stats["sampled_logp"]
    print(f"validation loss {val:.4f} nats/byte ({val / math.log(2):.3f} bits), bf16 rlk native {losses['val_bf16_rlk_native']:.4f}; "
          f"entropy_mean {stats['entropy_mean']:.3f}; sampled logp mean {s['mean']:.3f} frac_zero {s['frac_logp_zero']:.4f}; "
          f"healthy: {rec['healthy']}")
    print(f"wrote {_rel(ckpt)} ({rec['checkpoint']['sha256'][:16]}...), {_rel(json_path)}, {_rel(png_path)}; "
          f"{rec['total_seconds']:.0f}s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
