"""The megatron actor benchmark (``actor_bench``) on the CPU, tiny Qwen3 (2 layers, 2 x 16 tokens):

* the device fingerprint is exact (equal for equal bytes at any chunking) and changes with one
  flipped bit, a swap of two elements, the sign of a zero or the dtype;
* the whole CLI runs (fresh-process worker, rlk's trainer, strict and native megatron-core steps)
  and every check passes;
* a broken input fails the named checks: one bit of one rlk gradient (``grads_equal_rlk``) and one
  worker fingerprint (``run_to_run_equal``);
* ``--optimizer-offload`` reaches both arms and the run-to-run worker (megatron's
  HybridDeviceOptimizer holds the states on the host) and is recorded, with the host RSS peaks;
  ``--skip-rlk-reference`` leaves the rlk checks out.

megatron-core 0.19.2 is required (``CI`` set: the tests fail when it is missing).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.testing import require_megatron

ARGS = ["--config", "tiny", "--layers", "2", "--seqs", "2", "--seq-len", "16", "--device", "cpu"]


def test_cli_runs_and_passes(tmp_path):
    require_megatron()
    # A fresh single process picks its own rendezvous port: one this pytest process set (an earlier
    # test that started torch.distributed here) is taken.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.run([sys.executable, "-m", "rlk.integrations.megatron.actor_bench", "--out", str(tmp_path)] + ARGS,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads((tmp_path / "megatron_actor_cpu.json").read_text())
    assert r["passed"] and r["failures"] == [], r["failures"]
    assert set(r["checks"]) == {"run_to_run_equal", "logp_equal_rlk", "grads_equal_rlk",
                                "lm_head_bf16_rounding_equal_rlk", "native_weights_equal_strict",
                                "native_logp_close_to_strict"}
    # logp + (grad, weight) per parameter: 2 layers x 8 + embedding, final norm, LM head.
    assert r["run_to_run"] == {"tensors": 1 + 2 * 19, "differing_tensors": 0, "differing": []}
    assert r["vs_rlk_trainer"]["grads"]["tensors"] == 18
    assert r["native"]["seconds"]["step"] > 0 and r["strict"]["seconds"]["step"] > 0
    assert r["spec"]["tokens"] == 32 and "147 GB" in r["spec"]["reason_reduced_depth"]
    assert "stderr" not in r and p.stderr.count("[actor_bench") >= 6


def test_a_broken_input_fails_the_named_checks(tmp_path, monkeypatch):
    require_megatron()
    from rlk.integrations.megatron import actor_bench as B

    k = "decoder.layers.0.mlp.linear_fc2.weight"
    real_ref = B._rlk_reference

    def perturbed_ref(*a):
        lp, ref = real_ref(*a)
        ref[k] = ref[k].clone()
        w = ref[k].view(torch.int16).view(-1)
        w[0] = w[0] ^ 1
        return lp, ref

    def perturbed_worker(a):
        fps = B._worker_fingerprints(a)
        fps["weight/decoder.final_layernorm.weight"] = "changed"
        return fps

    monkeypatch.setattr(B, "_rlk_reference", perturbed_ref)
    monkeypatch.setattr(B, "_run_worker", perturbed_worker)
    assert B.main(["--out", str(tmp_path), "--skip-native"] + ARGS) == 1
    r = json.loads((tmp_path / "megatron_actor_cpu.json").read_text())
    assert not r["passed"] and sorted(r["failures"]) == ["grads_equal_rlk", "run_to_run_equal"]
    assert r["vs_rlk_trainer"]["grads"]["per_tensor_differing_elements"][k] == 1
    assert r["vs_rlk_trainer"]["grads"]["differing_elements"] == 1
    assert r["run_to_run"]["differing"] == ["weight/decoder.final_layernorm.weight"]
    assert r["native"] == {"skipped": "--skip-native"}


def test_optimizer_offload_reaches_both_arms_and_the_worker(tmp_path, monkeypatch):
    require_megatron()
    from rlk.integrations.megatron import actor_bench as B

    worker_argv = []

    def in_process_worker(a):
        # The worker's command line, parsed as the worker parses it, then run in this process.
        argv = B._args_of(a)
        worker_argv.append(argv)
        w = B._parser().parse_args(argv)
        w.recompute = None if w.recompute == "none" else w.recompute
        return B._worker_fingerprints(w)

    monkeypatch.setattr(B, "_run_worker", in_process_worker)
    assert B.main(["--out", str(tmp_path), "--optimizer-offload", "--skip-rlk-reference"] + ARGS) == 0
    r = json.loads((tmp_path / "megatron_actor_cpu.json").read_text())
    assert r["passed"] and set(r["checks"]) == {"run_to_run_equal", "native_weights_equal_strict",
                                                "native_logp_close_to_strict"}, r["checks"]
    assert worker_argv[0][worker_argv[0].index("--optimizer-offload") + 1] == "1.0"
    spec = r["spec"]
    assert spec["optimizer_offload"] == 1.0 and spec["optimizer_states"].startswith("host (megatron HybridDevice")
    assert "reason_reduced_depth" in spec and spec["rlk_reference"] is False
    assert "skipped" in r["vs_rlk_trainer"]
    for arm in ("strict", "native"):
        where = r[arm]["optimizer"]
        assert where["inner"] == "megatron HybridDeviceOptimizer" and where["main_params"] == "host", (arm, where)
        assert where["offloaded_tensors"] == where["tensors"] == 19 and where["device_state_bytes"] == 0, where
        assert r[arm]["peak_host_rss_gib"] > 0
    assert r["peak_host_rss_gib"]["main"] > 0


def test_native_micro_batches_add_up_to_the_one_batch_step():
    """``--native-micro-batches 2``: each micro-batch's loss over its own rows of the packed batch,
    gradients accumulated: logp and every main_grad as one micro-batch gives them (close, not
    bitwise: the CPU's GEMMs at another batch size), the logp back in packed order."""
    require_megatron()
    from rlk.integrations.megatron import actor_bench as B

    a = B._parser().parse_args(ARGS + ["--seqs", "4"])
    cfg, hf, pk, loss, m = B._setup(a)
    from rlk.integrations.megatron.native import NativeActor

    nat = NativeActor(cfg, hf, device=a.device, recompute=a.recompute, optimizer=False)
    params = dict(nat.model.named_parameters())
    runs = []
    for n in (1, 2):
        lp = nat.forward_backward(pk, loss, a.seqs, n)
        runs.append((lp, {k: p.main_grad.clone() for k, p in params.items()}))
    (lp1, g1), (lp2, g2) = runs
    assert lp1.shape == lp2.shape == (4 * 16,)
    torch.testing.assert_close(lp2, lp1, rtol=0, atol=2e-2)
    for k in g1:
        err = float((g2[k] - g1[k]).norm() / g1[k].norm().clamp_min(1e-30))
        assert err < 2e-2, (k, err)
    with pytest.raises(UnsupportedConfigError, match="micro-batches"):
        nat.forward_backward(pk, loss, a.seqs, 3)
    with pytest.raises(SystemExit):  # argparse: 3 does not divide --seqs 2
        B.main(["--out", "/nonexistent", "--native-micro-batches", "3"] + ARGS)


def test_the_record_is_named_after_the_gpu_it_ran_on(monkeypatch):
    from rlk.integrations.megatron import actor_bench as B

    assert B._device_tag("cpu") == "cpu"
    for name, tag in (("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "cuda")):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, n=name: n)
        assert B._device_tag("cuda") == tag, name
