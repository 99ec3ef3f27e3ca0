"""Runs the strict megatron-core GPTModel against rlk's own trainer pattern on the same weights
and packed tokens (used by the tests and by :mod:`rlk.integrations.megatron.cpu_probe`).

* :func:`megatron_logp` (one rank): build at TP=``tp``, CP=``cp``, load this rank's shard,
  forward with the rlk output processor over packed sequences (``thd``), optional actor
  backward of ``-sum(logp * loss_mask)``; returns logp and per-parameter gradients. At CP > 1
  the rank forwards its zigzag token rows (``spec.cp_token_index``, exact copies) with the
  global ``cu_seqlens``, as megatron's ``get_batch_on_this_cp_rank`` splits a ``thd`` batch;
  its logp rows are gathered back to global order (``logp.gather_cp``).
* :func:`reference_logp`: ``rlk.models.qwen3.Qwen3(route="strict").trainer_logp``.
* :func:`spawn_tp`: runs :func:`megatron_logp` on ``tp * cp`` gloo processes (fresh
  interpreters, ``OMP_NUM_THREADS=1``), results gathered through files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import torch

from rlk.models.qwen3 import Qwen3Config, random_weights
from rlk.replay import trainer


def tp2_config(layers: int = 2) -> Qwen3Config:
    """The tiny Qwen3 widened so that TP=2 gives the TP=1 bits: o_proj and down_proj have
    K = 512 (``rlk.nn.tensor_parallel.row_parallel_matches_tp1(512, 64, 2)``), vocab 256 = 2 x
    the (128, 128) logp segmentation."""
    import dataclasses

    return dataclasses.replace(Qwen3Config.named("tiny"), num_attention_heads=8, head_dim=64, intermediate_size=512,
                               num_hidden_layers=layers, name="tiny-tp2")


def fixture(cfg: Qwen3Config, seed: int = 0, n: int = 3, multiple: int = 1):
    """Seeded HF weights (bf16) and a packed batch of ``n`` prompt + response sequences; with
    ``multiple`` (e.g. 2*CP) each prompt is lengthened so that every sequence is a multiple of it
    (``multiple=1``: the original lengths and tokens)."""
    w = random_weights(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    plen = [-(-(5 + 5 * i) // multiple) * multiple - (2 + i) for i in range(n)]  # prompt 3+4i, response 2+i
    prompts = [torch.randint(0, cfg.vocab_size, (plen[i],), generator=g).tolist() for i in range(n)]
    resps = [torch.randint(0, cfg.vocab_size, (2 + i,), generator=g).tolist() for i in range(n)]
    return w, trainer.pack(prompts, resps)


def reference_logp(cfg: Qwen3Config, hf: dict, pk, actor: bool = True):
    """rlk's trainer pattern: ``(logp [T], grads by fused name | None)``."""
    from rlk.models.qwen3 import Qwen3

    m = Qwen3(cfg, hf, "strict")
    return m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=actor, loss_mask=pk.loss_mask)


def megatron_logp(cfg: Qwen3Config, hf: dict, pk, tp: int = 1, actor: bool = True, forward_audit: bool = False,
                  cp: int = 1):
    """One rank of the strict GPTModel: ``(logp [T] fp32, grads {param name: grad} | None, model)``.

    ``logp`` is in global packed order on every rank (at CP > 1 gathered from the CP ranks'
    rows). ``grads`` are this rank's: at CP > 1 the partial over its own token rows (megatron's
    DDP sums them over the data x context parallel group; not done here).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.packed_seq_params import PackedSeqParams

    from rlk.integrations.megatron import audit, spec, weights
    from rlk.integrations.megatron.logp import output_processor

    from rlk.integrations.megatron.logp import gather_cp

    spec.init_parallel(tp, cp)
    model = spec.build_gpt_model(cfg, tp, cp=cp)
    weights.load_into(model, weights.hf_to_megatron(cfg, hf, tp, ps.get_tensor_model_parallel_rank()))
    cu = pk.cu_seqlens.to(torch.int32)
    ms = int((cu[1:] - cu[:-1]).max())
    # cu_seqlens stay global at every CP degree (megatron's thd convention).
    psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=ms, max_seqlen_kv=ms)
    ids, targets, loss_mask = pk.ids, pk.targets, pk.loss_mask
    if cp > 1:  # this CP rank's zigzag rows (exact copies)
        idx = spec.cp_token_index(cu, cp, ps.get_context_parallel_rank())
        ids, targets, loss_mask = ids[idx], targets[idx], loss_mask[idx]
    T = ids.shape[0]
    tokens = ids.view(1, T)
    labels = targets.view(1, T)
    pos = None  # RoPE positions come from cu_seqlens inside RlkCoreAttention

    def fwd():
        return model(tokens, pos, None, labels=labels, packed_seq_params=psp,
                     output_processor=output_processor, output_processor_context={})

    guard = audit.forward_audit() if forward_audit else _nullcontext()
    if not actor:
        model.eval()
        with torch.no_grad(), guard:
            return gather_cp(fwd().view(T), cu), None, model
    model.train()
    with guard:  # the model's forward only (the loss below is the caller's arithmetic)
        logp = fwd().view(T)
    (-(logp * loss_mask.to(logp.dtype)).sum()).backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    return gather_cp(logp, cu), grads, model


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_tp(cfg: Qwen3Config, hf: dict, pk, tp: int, actor: bool = True, timeout: float = 300.0, cp: int = 1):
    """Runs :func:`megatron_logp` on ``tp * cp`` gloo processes; returns the rank-ordered list of
    ``(logp, grads, state)`` (``state``: that rank's parameters after loading)."""
    world = tp * cp
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.pt")
        torch.save({"cfg": cfg, "hf": hf, "pk": pk, "tp": tp, "cp": cp, "actor": actor}, inp)
        port = str(_free_port())
        procs = []
        for r in range(world):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, OMP_NUM_THREADS="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
            procs.append(subprocess.Popen([sys.executable, "-m", "rlk.integrations.megatron.harness", inp,
                                           os.path.join(d, f"out{r}.pt")], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        logs = []
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            logs.append(out.decode(errors="replace"))
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"spawn_tp: ranks {bad} failed:\n" + "\n".join(logs[r][-4000:] for r in bad))
        return [torch.load(os.path.join(d, f"out{r}.pt"), weights_only=False) for r in range(world)]


def _worker(inp: str, out: str) -> None:
    from rlk.integrations.megatron import weights

    a = torch.load(inp, weights_only=False)
    logp, grads, model = megatron_logp(a["cfg"], a["hf"], a["pk"], a["tp"], a["actor"], cp=a.get("cp", 1))
    state = weights.state_of(model)
    torch.save((logp, grads, state), out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
