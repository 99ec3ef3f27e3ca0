"""The production benchmark's trainer half on the tiny Qwen3 (CPU, Triton interpreter), both arms,
on a synthetic rollout file (4 sequences, 2 micro-batches):

* R/R, through ``bench arm --rollout-json`` (the trainer in its own process, the records merged):
  the rollout's logp are rlk's strict trainer's, so the actor forward matches every token bitwise
  and the arm passes with ``logp_mismatches == 0``;
* R/R on the same rollout with one logp one ulp off: fails closed (exit status 3, ``1 of 15`` in
  the message, the count in the record, no optimizer step);
* P/P: megatron's local spec with the packed core attention (CPU fallback) runs every phase,
  recomputes the old logp (close to the strict logp, not equal) and leaves gradients;
* the packed core attention equals megatron's own local ``DotProductAttention`` on the padded
  equivalent within bf16 tolerance, and that comparison sees a wrong K/V grouping.

megatron-core 0.19.2 is required (``CI`` set: the tests fail when it is missing).
"""

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

from rlk.integrations.megatron.testing import require_megatron
from rlk.integrations.production import records

PROMPTS = (5, 9, 3, 7)
RESPONSES = (4, 2, 6, 3)  # 15 response tokens, 39 packed
ARGS = ["--micro-tokens", "20", "--device", "cpu"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    require_megatron()
    from rlk.models.qwen3 import Qwen3, Qwen3Config, checkpoint, random_weights
    from rlk.replay import trainer

    d = tmp_path_factory.mktemp("prod")
    cfg = Qwen3Config.named("tiny")
    w = random_weights(cfg, 0)
    checkpoint.write_hf_dir(cfg, w, str(d / "ckpt"), meta={"generator": "random_weights", "seed": 0})
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPTS]
    resps = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in RESPONSES]
    lp, _, _ = trainer.score(Qwen3(cfg, w, "strict"), prompts, resps)  # rlk's strict trainer pattern
    flat = torch.cat([t.to(torch.float64) for t in lp])
    roll = {"workload": "W0", "generate_s": 1.5, "engine_start_s": 0.0}

    def rollout(name, logp):
        path = str(d / f"{name}.json")
        records.save_rollout(path, prompts, resps, logp)
        records.write_json(path, roll)
        return path

    bad = flat.to(torch.float32).clone()
    bad.view(torch.int32)[7] += 1  # one ulp on one response token
    return dict(d=d, ckpt=str(d / "ckpt"), good=rollout("good", flat), bad=rollout("bad", bad.to(torch.float64)))


def test_rr_reuses_rollout_logp_when_bitwise_equal(setup):
    out = str(setup["d"] / "pair0_rr.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # The child starts torch.distributed alone: it picks its own rendezvous (a test that ran earlier in
    # this process may have exported a MASTER_PORT that its own process group still holds).
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "rlk.integrations.production.bench", "arm", "--arm", "rr", "--dir",
                        setup["ckpt"], "--out", out, "--rollout-json", setup["good"]] + ARGS,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    rec = json.loads(open(out).read())
    assert rec["logp_mismatches"] == 0
    assert rec["train"]["rollout_vs_trainer_logp"]["compared_tokens"] == 15
    assert list(rec["phases"]) == ["rollout_generate", "ref_logp", "actor_fwd_bwd"]
    assert rec["total_s"] == pytest.approx(sum(rec["phases"].values()), abs=1e-3)
    assert rec["spec"] == {"layers": 2, "sequences": 4, "workload": "W0", "response_tokens": 15, "packed_tokens": 39,
                           "micro_batches": 2, "micro_tokens": 20, "recompute": "full"}
    assert "skipped" in rec["train"]["optimizer"] and rec["train"]["warmup_passes"] == 1
    assert rec["train"]["old_logp_source"].startswith("reused")
    prov = rec["train"]["provenance"]  # every contract the strict spec names is registered and hashed
    assert "errors" not in prov and prov["contracts"] and all(prov["contracts"].values())
    assert "copy_tbps" in rec["train"]["health"]  # probed (None without a GPU)


def test_rr_fails_closed_on_one_ulp(setup):
    from rlk.integrations.production.bench import __main__ as B

    out = setup["d"] / "bad_train.json"
    rc = B.main(["train", "--arm", "rr", "--dir", setup["ckpt"], "--rollout", setup["bad"], "--out", str(out),
                 "--warmup", "0"] + ARGS)
    assert rc == 3
    rec = json.loads(out.read_text())
    assert rec["logp_mismatches"] == 1 and "1 of 15 response tokens differ" in rec["failed"]
    first = rec["rollout_vs_trainer_logp"]["first_mismatch"]
    assert (first["request"], first["token"]) == (2, 1)  # flat index 7: after 4 + 2 tokens of requests 0, 1
    assert "optimizer" not in rec["phases"]


def test_pp_native_trainer_runs_every_phase(setup):
    from rlk.integrations.production import train_bench

    out = setup["d"] / "pp_train.json"
    rec = train_bench.run_train("pp", setup["ckpt"], setup["good"], str(out), micro_tokens=20, warmup=0,
                                device="cpu", optimizer_step=True)
    assert list(rec["phases"]) == ["old_logp", "ref_logp", "actor_fwd_bwd", "optimizer"]
    assert all(v["seconds"] > 0 for v in rec["phases"].values())
    assert "local spec, torch varlen flash attention" in rec["trainer"] and "logp_mismatches" not in rec
    cmp = rec["rollout_vs_trainer_logp"]  # native logp (bf16 logits) against the strict trainer's
    assert cmp["compared_tokens"] == 15 and cmp["mismatches"] > 0 and cmp["max_abs_diff"] < 0.5


def test_packed_attention_matches_megatron_local_attention(monkeypatch):
    require_megatron()
    from megatron.core import tensor_parallel
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from rlk.integrations.megatron import spec
    from rlk.integrations.megatron.varlen_attention import VarlenCoreAttention

    spec.init_parallel(1)
    tc = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                           bf16=True, params_dtype=torch.bfloat16, attention_dropout=0.0, masked_softmax_fusion=False,
                           use_cpu_initialization=True)
    # No CUDA generator on the CPU; the dropout is 0 and draws nothing (as actor_bench's native actor).
    monkeypatch.setattr(tensor_parallel.get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext(),
                        raising=False)
    ref_mod = DotProductAttention(tc, 1, AttnMaskType.causal, "self")
    mod = VarlenCoreAttention(config=tc, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    lens, S = [5, 9, 3], 9
    g = torch.Generator().manual_seed(0)
    q = torch.randn(S, 3, 4, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(S, 3, 2, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1).view(1, 1, S, S)
    from rlk.integrations.megatron.actor import cuda_names_on_cpu

    with cuda_names_on_cpu():  # megatron's score buffer asks for device "cuda"
        padded = ref_mod(q, k, v, mask).float()  # [s, b, nh * D]
    ref = torch.cat([padded[:n, b] for b, n in enumerate(lens)])
    cu = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9, max_seqlen_kv=9)

    def packed(t):
        return torch.cat([t[:n, b] for b, n in enumerate(lens)])

    out = mod(packed(q), packed(k), packed(v), None, packed_seq_params=psp).float()
    assert out.shape == ref.shape == (17, 64)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    swapped = mod(packed(q), packed(k).flip(1), packed(v).flip(1), None, packed_seq_params=psp).float()
    assert (swapped - ref).abs().max() > 0.1  # the comparison sees a wrong K/V grouping
    with pytest.raises(Exception, match="packed sequences only"):
        mod(q, k, v, mask)


@pytest.mark.gpu
def test_flash_backend_matches_the_cpu_fallback_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (torch varlen flash attention)")
    from rlk.integrations.megatron import varlen_attention as attention

    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 70, 300, 301, 512], dtype=torch.int32, device="cuda")
    q = torch.randn(512, 32, 128, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(512, 8, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    out = attention.varlen_causal_attention(q, k, v, cu, 230, 128 ** -0.5)
    ref = attention._sdpa_per_sequence(q, k, v, cu, 128 ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_warm_up_passes_cover_every_micro_batch(setup, monkeypatch):
    """The untimed warm-up runs each micro-batch through the forward and the forward/backward, so
    no kernel variant of a later micro-batch compiles inside a timed phase."""
    from rlk.integrations.production import train_bench

    seen = {"forward": [], "fwd_bwd": []}
    fwd, fb = train_bench.ArmTrainer.forward, train_bench.ArmTrainer.forward_backward

    def forward(self, pk):
        seen["forward"].append(pk.ids.shape[0])
        return fwd(self, pk)

    def forward_backward(self, batches):
        seen["fwd_bwd"].append([pk.ids.shape[0] for pk, _ in batches])
        return fb(self, batches)

    monkeypatch.setattr(train_bench.ArmTrainer, "forward", forward)
    monkeypatch.setattr(train_bench.ArmTrainer, "forward_backward", forward_backward)
    rec = train_bench.run_train("pp", setup["ckpt"], setup["good"], str(setup["d"] / "warm.json"), micro_tokens=20,
                                warmup=1, device="cpu", profile=True)
    sizes = seen["fwd_bwd"][-1]  # the timed forward/backward: every micro-batch
    assert rec["micro_batches"] == len(sizes) == 2
    assert seen["fwd_bwd"][0] == sizes, "the warm-up forward/backward skipped micro-batches"
    assert seen["forward"][:2] == sizes, "the warm-up forward skipped micro-batches"
    # warm-up, old logp, reference logp, then the profiled repeats of old and reference logp
    assert len(seen["forward"]) == 5 * len(sizes)
    assert list(rec["attribution"]) == ["old_logp", "ref_logp", "actor_fwd_bwd"]
    assert all(v["wall_s"] > 0 and v["device_s"] == 0 for v in rec["attribution"].values())  # CPU: no kernels
    assert rec["phases"].keys() == {"old_logp", "ref_logp", "actor_fwd_bwd"}  # the repeats are not counted
