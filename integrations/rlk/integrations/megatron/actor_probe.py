"""Record of the strict megatron-core actor on the CPU: run to run across fresh processes and
against rlk's own trainer, with per-tensor counts.

    python -m rlk.integrations.megatron.actor_probe --out docs/results/megatron_actor_cpu.json

Tiny Qwen3 (``harness.fixture``: 3 packed sequences), GRPO's clipped loss (``rlk.rl.grpo``,
old logp = the strict forward's, seeded advantages), one ``MegatronActor`` step (DDP fp32
main_grad buffers, no-pipelining schedule, DistributedOptimizer Adam, lr 1e-2):

* ``run_to_run``: the step in two fresh interpreters (tensors exchanged as safetensors files):
  differing elements of every main_grad and every updated bf16 weight;
* ``vs_rlk_trainer``: per parameter, main_grad against rlk's strict trainer gradient widened to
  fp32 (differing elements, max |diff|), and the LM head's bf16 rounding against it;
* ``adam_vs_rl_loop``: the updated weights against the RL loop's own Adam step
  (``rlk.rl.loop.Trainer.apply``) fed rlk's bf16 gradients, and fed megatron's fp32 main_grads;
* ``negative_control``: the same comparisons with one prompt token changed (must differ).

Exit status 1 when run to run differs, a non-LM-head gradient differs from rlk's, the LM head's
rounding differs, the Adam steps on equal gradients differ, or the control shows no difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from rlk import determinism

if not os.environ.get("TRITON_INTERPRET"):
    determinism.configure_cpu_interpreter_without_gpu()

import torch  # noqa: E402

LM_HEAD = "output_layer.weight"


def _setup(perturb: bool = False):
    from rlk.integrations.megatron import harness
    from rlk.models.qwen3 import Qwen3Config
    from rlk.rl import grpo

    cfg = Qwen3Config.named("tiny")
    hf, pk = harness.fixture(cfg)
    old, _ = harness.reference_logp(cfg, hf, pk, actor=False)
    adv = torch.randn(pk.ids.shape[0], generator=torch.Generator().manual_seed(7))
    loss = grpo.token_loss_fn(old, adv, pk.loss_mask, 0.2, int(pk.loss_mask.sum()))
    if perturb:
        ids = pk.ids.clone()
        ids[3] = (ids[3] + 1) % cfg.vocab_size
        pk = dataclasses.replace(pk, ids=ids)
    return cfg, hf, pk, loss


def actor_run(perturb: bool = False) -> dict[str, torch.Tensor]:
    """One actor step: ``grad/<name>`` (fp32 main_grad before the step) and ``weight/<name>``
    (bf16 after it), plus ``logp``."""
    from rlk.integrations.megatron.actor import MegatronActor, actor_step

    cfg, hf, pk, loss = _setup(perturb)
    actor = MegatronActor(cfg, hf, lr=1e-2)
    (logp,), out = actor_step(actor, [(pk, loss)])
    res = {f"grad/{k}": v for k, v in out["main_grads"].items()}
    res.update({f"weight/{k}": v for k, v in actor.weights().items()})
    res["logp"] = logp.detach().clone()
    return res


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    ne = a.view(torch.int16 if a.element_size() == 2 else torch.int32) != \
        b.view(torch.int16 if b.element_size() == 2 else torch.int32)
    return {"elements": int(a.numel()), "differ": int(ne.sum()),
            "max_abs_diff": float((a.float() - b.float()).abs().max())}


def _fresh_process_runs(n: int = 2) -> list[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    outs = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            path = os.path.join(d, f"run{i}.safetensors")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1",
                       TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
            p = subprocess.run([sys.executable, "-m", "rlk.integrations.megatron.actor_probe", "--worker", path],
                               env=env, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise RuntimeError(f"actor_probe worker {i} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            outs.append(load_file(path))
    return outs


def _vs_rlk(cfg, hf, pk, loss, run: dict[str, torch.Tensor]) -> dict:
    from rlk.models.qwen3 import Qwen3
    from rlk.models.qwen3.layouts import fused_to_megatron, hf_to_fused, megatron_to_fused
    from rlk.rl.loop import LoopConfig, Trainer

    m = Qwen3(cfg, hf, "strict")
    lp, g = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=True, token_loss=loss, host_cu=pk.host_cu)
    ref = fused_to_megatron(cfg, g)
    grads = {k[5:]: v for k, v in run.items() if k.startswith("grad/")}
    weights = {k[7:]: v for k, v in run.items() if k.startswith("weight/")}
    out = {"logp": _diff(run["logp"], lp), "grads": {k: _diff(grads[k], ref[k].float()) for k in grads},
           "lm_head_bf16_rounding": _diff(grads[LM_HEAD].to(torch.bfloat16), ref[LM_HEAD])}

    def loop_step(gr):
        tr = Trainer(cfg, hf_to_fused(cfg, hf), "strict", LoopConfig(lr=1e-2, betas=(0.9, 0.999)))
        tr.apply(gr)
        return fused_to_megatron(cfg, tr.model.w)

    with_rlk = loop_step(g)
    with_main = loop_step(megatron_to_fused(cfg, grads))
    out["adam_vs_rl_loop"] = {"rlk_bf16_grads": {k: _diff(weights[k], with_rlk[k]) for k in weights},
                              "megatron_fp32_main_grads": {k: _diff(weights[k], with_main[k]) for k in weights}}
    return out


def run() -> dict:
    t0 = time.perf_counter()
    cfg, hf, pk, loss = _setup()
    fresh = _fresh_process_runs()
    rtr = {k: _diff(fresh[0][k], fresh[1][k]) for k in fresh[0]}
    vs = _vs_rlk(cfg, hf, pk, loss, fresh[0])
    bad = actor_run(perturb=True)
    control = {"run_to_run_differ": sum(_diff(fresh[0][k], bad[k])["differ"] for k in fresh[0] if k != "logp"),
               "vs_rlk_grad_differ": sum(_diff(bad["grad/" + k], fresh[0]["grad/" + k])["differ"]
                                         for k in vs["grads"])}
    failures = []
    if any(v["differ"] for v in rtr.values()):
        failures.append("run to run differs")
    if vs["logp"]["differ"]:
        failures.append("logp differs from rlk's trainer")
    if any(v["differ"] for k, v in vs["grads"].items() if k != LM_HEAD):
        failures.append("a non-LM-head main_grad differs from rlk's gradient")
    if vs["lm_head_bf16_rounding"]["differ"]:
        failures.append("bf16(LM-head main_grad) differs from rlk's gradient")
    if any(v["differ"] for v in vs["adam_vs_rl_loop"]["megatron_fp32_main_grads"].values()):
        failures.append("Adam steps on equal gradients differ")
    if not (control["run_to_run_differ"] and control["vs_rlk_grad_differ"]):
        failures.append("the negative control shows no difference (the checks could not fail)")
    try:
        from rlk.integrations.megatron import spec, version
        from rlk.provenance import capability_record

        prov = capability_record("strict", contract_ids=sorted(set(spec.CONTRACTS.values())),
                                 extra={"engine": "megatron-core", "engine_version": version(),
                                        "pattern": "megatron_actor"}, load_contracts=False)
    except Exception as e:  # the record is still written
        prov = {"torch": torch.__version__, "error": repr(e)}
    return {"provenance": prov, "config": cfg.to_dict(), "tokens": int(pk.ids.shape[0]),
            "actor": "MegatronActor: DDP(grad_reduce_in_fp32) + forward_backward_no_pipelining + "
                     "DistributedOptimizer(adam, bf16, lr 1e-2); LM head: loss_output_processor (main_grad)",
            "loss": "rlk.rl.grpo clipped loss, clip 0.2, old logp = strict forward, advantages seed 7",
            "run_to_run_fresh_processes": rtr, "vs_rlk_trainer": vs, "negative_control_one_token_changed": control,
            "failures": failures, "passed": not failures, "seconds": round(time.perf_counter() - t0, 1),
            "note": "CPU Triton interpreter, gloo, one process per run; megatron's CUDA-device queries "
                    "answered by actor.cuda_names_on_cpu"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # one actor step, tensors to this safetensors file
    a = ap.parse_args(argv)
    if a.worker:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in actor_run().items()}, a.worker)
        return 0
    if not a.out:
        ap.error("--out is required")
    res = run()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    lm = res["vs_rlk_trainer"]["grads"][LM_HEAD]
    print(json.dumps({"passed": res["passed"], "failures": res["failures"], "lm_head_fp32_vs_rlk_bf16": lm,
                      "seconds": res["seconds"]}))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
