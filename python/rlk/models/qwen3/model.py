"""Qwen3 dense decoder, written once over a route's op set (``strict`` or ``native``).

Two execution patterns share every line of the layer code:

* **trainer** (:meth:`Qwen3.trainer_logp`): packed variable-length sequences (``cu_seqlens``),
  one causal forward over prompt + response, positions restarting per sequence, selected-token
  logp of ``targets`` at every row; actor mode with autograd, reference mode forward-only.
* **rollout step** (:meth:`Qwen3.rollout_step`): the tokens of one continuous-batching step
  (chunked-prefill chunks and decode tokens mixed), K/V written to a paged cache, attention over
  the cache through block tables. Driven by :mod:`rlk.replay.rollout`.

Layer order (Hugging Face Qwen3, residual fused into the next norm as vLLM does):
``embed -> [norm1 -> qkv -> q/k-norm -> rope -> attn -> o -> (add+norm2) -> gate_up -> swiglu
-> down -> (add+norm1 of next layer)] -> (add+final norm) -> linear_logp``.
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import Qwen3Config
from rlk.models.qwen3.layouts import hf_to_fused
from rlk.models.qwen3.routes import FusedLossOps, PagedMeta, make_ops


class Qwen3:
    """A Qwen3 model over fused weights (``layouts.hf_to_fused``) and one route.

    Args:
      cfg: the model config.
      weights: internal fused dict (vLLM naming) or Hugging Face dict (converted here).
      route: ``"strict"`` (rlk ops, contract IDs in ``routes.StrictOps.contracts``) or ``"native"``.
      rope: the RoPE table (``ops.rope_table`` of this config and device) to use instead of making
        one: a caller whose CUDA graphs read a table by address keeps one alive for all its models.
    """

    def __init__(self, cfg: Qwen3Config, weights: dict[str, torch.Tensor], route: str = "strict", rope=None):
        self.cfg = cfg
        self.w = weights if "lm_head.weight" in weights and any("qkv_proj" in k for k in weights) \
            else hf_to_fused(cfg, weights)
        self.route = route
        self.ops = make_ops(route, cfg.vocab_size)
        emb = self.w["model.embed_tokens.weight"]
        self.device, self.dtype = emb.device, emb.dtype
        self.rope = rope if rope is not None else \
            self.ops.rope_table(cfg.max_position_embeddings, cfg.head_dim, cfg.rope_theta, self.device)
        self.scale = cfg.head_dim ** -0.5

    # ---- shared layer code -------------------------------------------------------------------
    def _forward(self, w, ids, positions, attn, probes=None):
        """Final-normed hidden ``[T, H]``; ``attn(i, q, k, v) -> [T, Hq, D]`` is the pattern's."""
        cfg, ops, eps = self.cfg, self.ops, self.cfg.rms_norm_eps
        T = ids.shape[0]
        Hq, Hk, D, qs, kvs = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.q_size, cfg.kv_size
        x = ops.embedding(ids, w["model.embed_tokens.weight"])
        residual = None
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            if residual is None:
                residual = x
                x = ops.rms_norm(x, w[p + "input_layernorm.weight"], eps)
            else:
                x, residual = ops.add_rms_norm(x, residual, w[p + "input_layernorm.weight"], eps)
            qkv = ops.linear(x, w[p + "self_attn.qkv_proj.weight"])
            # Strided views of the fused output, no copies: the q/k norms, write_kv and the
            # attention kernels take any token/head strides (last dim contiguous).
            q, k = ops.qk_norm_rope(qkv[:, :qs + kvs].view(T, Hq + Hk, D), w[p + "self_attn.q_norm.weight"],
                                    w[p + "self_attn.k_norm.weight"], eps, positions, self.rope, Hq)
            v = qkv[:, qs + kvs:].view(T, Hk, D)
            o = attn(i, q, k, v)
            x = ops.linear(o.reshape(T, qs), w[p + "self_attn.o_proj.weight"])
            if probes is not None:
                probes.setdefault("attn_out", []).append(x.detach())
            x, residual = ops.add_rms_norm(x, residual, w[p + "post_attention_layernorm.weight"], eps)
            x = ops.linear(ops.swiglu(ops.linear(x, w[p + "mlp.gate_up_proj.weight"])), w[p + "mlp.down_proj.weight"])
            if probes is not None:
                probes.setdefault("mlp_out", []).append(x.detach())
        x, _ = ops.add_rms_norm(x, residual, w["model.norm.weight"], eps)
        if probes is not None:
            probes["final"] = x.detach()
        return x

    # ---- serving warm-up -----------------------------------------------------------------------
    def warm_row_counts(self, max_tokens: int) -> list[int]:
        """Token counts whose forwards compile every Triton specialization the row ops meet at any
        count up to ``max_tokens``: Triton specializes an integer argument on its divisibility by
        16, and the row ops take row counts ``T``, ``T * heads`` (32 q heads: always a multiple of
        16; 8 kv heads: one iff ``T`` is even), so per regime (at most / above the fused QK-norm +
        RoPE limit) an odd, an even and a multiple-of-16 count; plus the largest counts."""
        fq = int(getattr(self.ops, "fused_qk_norm_rope_max_tokens", 0) or 0)
        cands = {1, 2, 3, 16, 17, 18, 32, max_tokens - 2, max_tokens - 1, max_tokens}
        if fq:
            above16 = fq + 16 - fq % 16
            cands |= {fq - 1, fq, fq + 1, fq + 2, above16, above16 + 1, above16 + 2}
        return sorted(t for t in cands if 1 <= t <= max_tokens)

    @torch.no_grad()
    def warm_up_rows(self, max_tokens: int, counts: list[int] | None = None) -> list[int]:
        """Runs the forward once per :meth:`warm_row_counts` (attention replaced by zeros: the
        engine's attention needs its KV cache) so that a serving engine compiles nothing while it
        serves batches of other sizes. GEMM variants per row count are compiled by
        ``rlk.kernels.gemm.launch.warm_up``. Returns the counts run."""
        from rlk.kernels.common import host_validated

        counts = self.warm_row_counts(max_tokens) if counts is None else counts

        def zeros(i, q, k, v):
            return torch.zeros_like(q)

        for T in counts:
            ids = torch.zeros(T, dtype=torch.int64, device=self.device)
            pos = torch.arange(T, dtype=torch.int64, device=self.device) % self.cfg.max_position_embeddings
            with host_validated():  # as an engine's forward runs (its inputs are checked at admission)
                self._forward(self.w, ids, pos, zeros)
        return counts

    # ---- trainer pattern -----------------------------------------------------------------------
    # The strict actor's LM head through the fused logp + loss path (ops.logp_loss: gradients
    # formed in the forward, 3 GEMM-equivalents instead of 4). Same bytes as the unfused path:
    # bitwise in the CPU tests and on the H200 (python -m rlk.models.qwen3.fused_actor_probe,
    # docs/results/fused_actor_probe_h200.json, and python -m rlk.bench.actor_lm_head_bench at the L5
    # size: logp and every gradient equal). On by default: at Qwen3's 151,936-column vocabulary
    # the fused op takes 0.76-0.83x the unfused op's time (docs/results/linear_logp_h200.json,
    # T 1024 / 8192 / 32768); the actor phase as a whole is host-noisy on the H200 machine
    # (docs/results/actor_lm_head/: two runs, fused 0.97x and 1.18x unfused, rounds spread 28-44
    # ms). Costs up to the ROWS_BUDGET_MB of kept logits. Set False on the class or an instance
    # for the unfused path.
    fused_actor_lm_head = True

    def trainer_logp(self, ids, cu_seqlens, targets, *, actor=False, loss_mask=None, probes=None, host_cu=None,
                     token_loss=None):
        """Selected-token logp of ``targets`` over packed sequences.

        Args:
          ids: ``[T]`` int64, sequences packed back to back.
          cu_seqlens: ``[B+1]`` int32 boundaries; positions restart at 0 in each sequence.
          targets: ``[T]`` int64, the token whose logp each row gives (next token; any value
            where not wanted).
          actor: with autograd (weights as leaves) and a backward of ``-sum(logp * loss_mask)``;
            otherwise forward-only under ``torch.no_grad`` (reference logp).
          loss_mask: ``[T]`` bool, rows in the actor loss (default all).
          token_loss: actor only: ``token_loss(logp_rows, lo, hi) -> [hi - lo]``, the per-token
            losses of rows ``[lo, hi)`` (fp32 logp in, differentiable in logp; row ``t``'s loss
            depends on row ``t`` only), replacing ``-logp * loss_mask``; the backward is of their
            sum. An RL actor loss (importance ratio, clipping, advantages) goes here; the callable
            does its own masking (``loss_mask`` is not applied).
          host_cu: ``cu_seqlens`` as a host list, when the caller has it: the length checks and
            ``max_seqlen`` then read nothing back from the device (no synchronization, so the
            host can queue the next micro-batch while this one runs). Trusted to equal
            ``cu_seqlens``: only its length and last entry are checked.
        Returns:
          ``(logp [T] fp32, grads)``; ``grads`` maps fused weight names to gradients (actor) or
          is ``None``.

        Determinism: strict route: every row's bytes follow the contracts in
        ``routes.StrictOps.contracts`` (batch-invariant, run-to-run bitwise); native: none.
        """
        cfg = self.cfg
        cu = cu_seqlens.to(self.device, torch.int32)
        lens = (cu[1:] - cu[:-1]).long()
        if host_cu is None:
            host_cu = cu.tolist()  # one device read
        host_cu = [int(c) for c in host_cu]
        if len(host_cu) != cu.shape[0]:
            raise UnsupportedConfigError(f"host_cu has {len(host_cu)} entries, cu_seqlens {cu.shape[0]}")
        if host_cu[-1] != ids.shape[0]:
            raise UnsupportedConfigError(f"cu_seqlens ends at {host_cu[-1]}, ids has {ids.shape[0]} rows")
        max_seqlen = max((b - a for a, b in zip(host_cu, host_cu[1:])), default=0)
        if max_seqlen > cfg.max_position_embeddings:
            raise UnsupportedConfigError(f"sequence of {max_seqlen} > max_position_embeddings")
        starts = torch.repeat_interleave(cu[:-1].long(), lens, output_size=ids.shape[0])
        positions = torch.arange(ids.shape[0], device=self.device) - starts

        def attn(i, q, k, v):
            return self.ops.attn_varlen(q, k, v, cu, max_seqlen, self.scale)

        if token_loss is not None and not actor:
            raise UnsupportedConfigError("token_loss needs actor=True (a forward-only pass has no loss)")
        if not actor:
            with torch.no_grad():
                h = self._forward(self.w, ids, positions, attn, probes)
                return self.ops.logp(h, self.w["lm_head.weight"], targets), None
        leaves = {}
        for k, t in self.w.items():
            if k == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            leaves[k] = t.detach().clone().requires_grad_(True)
        if cfg.tie_word_embeddings:
            leaves["lm_head.weight"] = leaves["model.embed_tokens.weight"]
        with torch.enable_grad():
            h = self._forward(leaves, ids, positions, attn, probes)
            if token_loss is None:
                m = (torch.ones(ids.shape[0], dtype=torch.float32, device=self.device) if loss_mask is None
                     else loss_mask.to(self.device, torch.float32))

                def token_loss(lp, lo, hi):
                    return -(lp * m[lo:hi])

            fused = self.ops.logp_loss if self.fused_actor_lm_head and isinstance(self.ops, FusedLossOps) else None
            if fused is not None:
                # Strict: the loss is known at forward time, so the LM head's gradients are
                # formed with its forward (3 GEMM-equivalents, not 4); the same bytes as the
                # unfused backward of the same per-token losses (logp.v2, fused_test).
                loss, logp = fused(h, leaves["lm_head.weight"], targets, token_loss)
            else:
                logp = self.ops.logp(h, leaves["lm_head.weight"], targets)
                loss = token_loss(logp, 0, logp.shape[0]).sum()
            loss.backward()
        grads = {k: t.grad for k, t in leaves.items() if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
        return logp.detach(), grads

    @torch.no_grad()
    def final_hidden(self, ids, cu_seqlens):
        """Final-normed hidden ``[T, H]`` of packed sequences (the trainer pattern's forward,
        without the LM head); for distribution statistics (:mod:`rlk.models.qwen3.distribution`)."""
        cu = cu_seqlens.to(self.device, torch.int32)
        host_cu = [int(c) for c in cu.tolist()]
        max_seqlen = max((b - a for a, b in zip(host_cu, host_cu[1:])), default=0)
        if max_seqlen > self.cfg.max_position_embeddings or host_cu[-1] != ids.shape[0]:
            raise UnsupportedConfigError(f"cu_seqlens {host_cu[:4]}... do not fit {ids.shape[0]} rows "
                                         f"(max_position_embeddings {self.cfg.max_position_embeddings})")
        lens = (cu[1:] - cu[:-1]).long()
        starts = torch.repeat_interleave(cu[:-1].long(), lens, output_size=ids.shape[0])
        positions = torch.arange(ids.shape[0], device=self.device) - starts
        return self._forward(self.w, ids, positions,
                             lambda i, q, k, v: self.ops.attn_varlen(q, k, v, cu, max_seqlen, self.scale))

    # ---- rollout pattern -----------------------------------------------------------------------
    def new_kv_cache(self, num_blocks: int, block_size: int):
        """Per-layer ``(k_cache, v_cache)``, each ``[num_blocks, block_size, Hk, D]``, zeroed."""
        shape = (num_blocks, block_size, self.cfg.num_key_value_heads, self.cfg.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(self.cfg.num_hidden_layers)]

    @torch.no_grad()
    def rollout_step(self, ids, positions, kv_cache, meta: PagedMeta, probes=None):
        """Final-normed hidden ``[T, H]`` of one step's tokens (K/V written into ``kv_cache``).

        ``meta``: block tables ``[B, nb]`` int32, ``cu_seqlens_q [B+1]`` int32, ``seq_lens_kv
        [B]`` int32 (length after this step), ``slot_mapping [T]`` int64. Query ``i`` of
        sequence ``b`` sits at position ``seq_lens_kv[b] - q_len_b + i``.
        """
        meta = self.ops.prepare_paged(meta)

        def attn(i, q, k, v):
            kc, vc = kv_cache[i]
            self.ops.write_kv(k, v, kc, vc, meta)
            return self.ops.attn_paged(q, kc, vc, meta, self.scale)

        return self._forward(self.w, ids, positions, attn, probes)

    @torch.no_grad()
    def logp(self, hidden, targets):
        return self.ops.logp(hidden, self.w["lm_head.weight"], targets)

    @torch.no_grad()
    def logits(self, hidden):
        return self.ops.logits(hidden, self.w["lm_head.weight"])

    @torch.no_grad()
    def logits_for_sampling(self, hidden):
        """``(logits [T, V] fp32, stats)`` from one LM-head pass; ``stats`` feeds
        :meth:`logp_of_sampled` (strict: the pass's lse)."""
        return self.ops.logits_and_stats(hidden, self.w["lm_head.weight"])

    @torch.no_grad()
    def logp_of_sampled(self, logits, stats, tokens):
        """Selected-token logp of ``tokens`` from :meth:`logits_for_sampling`'s pass.

        Determinism: strict: ``x_target - lse`` in fp32, the bytes :meth:`logp` gives
        (contract logp.v2: logp = x_target - lse); native: log_softmax of the same logits."""
        return self.ops.logp_from_logits(logits, stats, tokens)
