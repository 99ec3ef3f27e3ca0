"""The two routes of the Qwen3 model: ``strict`` (rlk ops only) and ``native`` (torch).

Both expose the same small op set, so the model code (``model.py``) is written once. The strict
route imports rlk ops lazily (inside its constructor), so the native route and the replay
harness work without the kernels. Nothing in the strict route falls back to torch arithmetic:
tensor work outside rlk ops is limited to exact copies (slicing, ``contiguous``, indexing).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from rlk.contracts import STRICT_CONTRACTS
from rlk.errors import UnsupportedConfigError

ROUTES = ("strict", "native")

# The model's ops (docs/API.md); the strict route runs each under its entry of the one contract
# map, rlk.contracts.STRICT_CONTRACTS, and records those IDs (``StrictOps.contracts``).
MODEL_OPS = ("gemm", "rmsnorm", "rope", "swiglu", "embedding", "attention", "linear_logp")


@dataclasses.dataclass
class PagedMeta:
    """One rollout step's attention metadata (shared by every layer of the step)."""

    block_tables: torch.Tensor  # [B, nb] int32
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    seq_lens_kv: torch.Tensor  # [B] int32
    slot_mapping: torch.Tensor  # [T] int64
    block_size: int
    max_seqlen_q: int | None = None  # host int (avoids a device read-back)
    # Host copies of cu_seqlens_q / seq_lens_kv (the executor builds them anyway); the native
    # route reads these instead of the device. Eager steps only: a captured graph would bake them in.
    host_cu: list[int] | None = None
    host_lens: list[int] | None = None
    # A padded decode step (rlk.replay.rollout): one query per sequence, shapes fixed by the
    # bucket and the block-table width; padding rows have slot -1 and kv length 0. Lengths are
    # read on the device only, so the step can be captured in a CUDA graph.
    padded_decode: bool = False
    native: dict | None = None  # gather indices, built once per step by the native route


def _qk_norm_rope_parts(ops, qk, q_weight, k_weight, eps, positions, table, n_q):
    """(q, k) of ``qk_norm_rope`` from the separate ops (``qk_norm``, then ``apply_rope``)."""
    q = ops.apply_rope(ops.qk_norm(qk[:, :n_q], q_weight, eps), positions, table)
    k = ops.apply_rope(ops.qk_norm(qk[:, n_q:], k_weight, eps), positions, table)
    return q, k


@runtime_checkable
class RouteOps(Protocol):
    """The op set the model code calls; both routes implement it with the same parameter names
    (``routes_test`` checks the signatures, so one route cannot drift from the other)."""

    name: str

    def linear(self, x, w): ...
    def embedding(self, ids, w): ...
    def rms_norm(self, x, w, eps): ...
    def add_rms_norm(self, x, residual, w, eps): ...
    def qk_norm(self, x, w, eps): ...
    def rope_table(self, max_positions, head_dim, theta, device): ...
    def apply_rope(self, x, positions, table): ...
    def qk_norm_rope(self, qk, q_weight, k_weight, eps, positions, table, n_q): ...
    def swiglu(self, gate_up): ...
    def attn_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale): ...
    def prepare_paged(self, meta): ...
    def write_kv(self, k, v, k_cache, v_cache, meta): ...
    def attn_paged(self, q, k_cache, v_cache, meta, scale): ...
    def logits(self, hidden, w, vocab_real=None): ...
    def logp(self, hidden, w, targets, vocab_real=None): ...
    def logits_and_stats(self, hidden, w, vocab_real=None): ...
    def logp_from_logits(self, logits, stats, tokens): ...


@runtime_checkable
class FusedLossOps(Protocol):
    """A route whose LM head forms its gradients in the forward (strict: ``logp.v2``'s fused
    loss); the model uses it for the actor when ``fused_actor_lm_head`` is on."""

    def logp_loss(self, hidden, w, targets, loss_fn, vocab_real=None): ...


class StrictOps:
    """rlk ops (docs/API.md). Contract IDs: ``rlk.contracts.STRICT_CONTRACTS`` of ``MODEL_OPS``."""

    name = "strict"
    contracts = {op: STRICT_CONTRACTS[op] for op in MODEL_OPS}

    def __init__(self, vocab_size: int | None = None):
        from rlk.kernels.attention import autograd as attention
        from rlk.kernels.attention import launch as attn_launch
        from rlk.kernels.gemm import autograd as gemm
        from rlk.kernels.linear_logp import autograd as linear_logp
        from rlk.kernels.rowops import autograd as rowops
        from rlk.kernels.rowops import launch as rowops_launch

        self._gemm, self._rowops, self._attn, self._alaunch = gemm, rowops, attention, attn_launch
        self._rlaunch = rowops_launch
        self._logp = linear_logp
        self.logp_segmentation = logp_segmentation(vocab_size)

    def linear(self, x, w):
        return self._gemm.linear(x, w)

    def embedding(self, ids, w):
        return self._rowops.embedding(ids, w)

    def rms_norm(self, x, w, eps):
        return self._rowops.rms_norm(x, w, eps)

    def add_rms_norm(self, x, residual, w, eps):
        return self._rowops.add_rms_norm(x, residual, w, eps)

    def qk_norm(self, x, w, eps):
        return self._rowops.qk_norm(x, w, eps)

    def rope_table(self, max_positions, head_dim, theta, device):
        return self._rowops.rope_table(max_positions, head_dim, theta, device)

    def apply_rope(self, x, positions, table):
        cos, sin = table
        return self._rowops.apply_rope(x, positions, cos, sin)

    # Token counts up to which the fused QK-norm + RoPE launch is used. Both forms give the same
    # bytes (rowops_invariance_test), so the choice is speed only: at Qwen3-8B's 32 + 8 heads the
    # fused kernel takes 6.9 us against the four launches' 9.1 us at 64 tokens, but 12.3 vs 10.3
    # us at 256 and 71.9 vs 26.9 us at 2048 (CUDA-graph timing, docs/results/kernel_baselines_h200.json).
    fused_qk_norm_rope_max_tokens = 128

    def qk_norm_rope(self, qk, q_weight, k_weight, eps, positions, table, n_q):
        """(q, k): QK-norm then RoPE of the first ``n_q`` heads (q) and the rest (k) of ``qk``.

        Without autograd and at most ``fused_qk_norm_rope_max_tokens`` tokens (decode steps): one
        fused launch (``rowops.qk_norm_rope``, the same bytes); otherwise (prefill chunks, the
        trainer, the actor with autograd) the two ops per part."""
        cos, sin = table
        if qk.shape[0] > self.fused_qk_norm_rope_max_tokens or (torch.is_grad_enabled() and (
                qk.requires_grad or q_weight.requires_grad or k_weight.requires_grad)):
            return _qk_norm_rope_parts(self, qk, q_weight, k_weight, eps, positions, table, n_q)
        return self._rlaunch.qk_norm_rope(qk, q_weight, k_weight, eps, n_q, positions, cos, sin)

    def swiglu(self, gate_up):
        return self._rowops.swiglu(gate_up)

    def attn_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        return self._attn.varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale)

    def prepare_paged(self, meta: PagedMeta) -> PagedMeta:
        return meta

    def write_kv(self, k, v, k_cache, v_cache, meta: PagedMeta):
        self._alaunch.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)

    def attn_paged(self, q, k_cache, v_cache, meta: PagedMeta, scale, out=None):
        """``out``: optional buffer like ``q`` that receives the rows (an engine's padded batch)."""
        out, _lse = self._alaunch.paged(q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q,
                                        meta.seq_lens_kv, scale, max_seqlen_q=meta.max_seqlen_q, out=out)
        return out

    def logp(self, hidden, w, targets, vocab_real=None):
        return self._logp.linear_logp(hidden, w, targets, vocab_real=vocab_real,
                                      segmentation=self.logp_segmentation).logp

    def logp_loss(self, hidden, w, targets, loss_fn, vocab_real=None):
        """(loss, logp) of ``sum_t loss_fn(logp)_t`` through the fused LM head + loss path
        (``linear_logp_loss``: gradients formed in the forward; bytes of the unfused backward)."""
        return self._logp.linear_logp_loss(hidden, w, targets, loss_fn, vocab_real=vocab_real,
                                           segmentation=self.logp_segmentation)

    def logits(self, hidden, w, vocab_real=None):
        """Logits for sampling only (the recorded logp comes from :meth:`logp`)."""
        return self.logits_and_stats(hidden, w, vocab_real)[0]

    def logits_and_stats(self, hidden, w, vocab_real=None):
        """(logits [T, V] fp32, lse [T] fp32) of one ``linear_logp`` pass."""
        dummy = torch.zeros(hidden.shape[0], dtype=torch.int64, device=hidden.device)
        out = self._logp.linear_logp(hidden, w, dummy, vocab_real=vocab_real, return_logits=True,
                                     segmentation=self.logp_segmentation)
        return out.logits, out.lse

    def logp_from_logits(self, logits, stats, tokens):
        """logp = x_target - lse (``stats`` is the pass's lse): one fp32 subtraction of the pass's
        own values, the operation and operands logp.v2's merge uses, so the bytes equal
        :meth:`logp` (tested)."""
        return logits.gather(1, tokens[:, None])[:, 0] - stats


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class NativeOps:
    """torch/cuBLAS/SDPA in Hugging Face's order and rounding points (the P/P arm)."""

    name = "native"
    contracts = {k: "native" for k in MODEL_OPS}

    def linear(self, x, w):
        return F.linear(x, w)

    def embedding(self, ids, w):
        return F.embedding(ids, w)

    def rms_norm(self, x, w, eps):
        # Hugging Face Qwen3RMSNorm: fp32 statistics, round to the input dtype, then * weight.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    def add_rms_norm(self, x, residual, w, eps):
        r = x + residual
        return self.rms_norm(r, w, eps), r

    def qk_norm(self, x, w, eps):
        return self.rms_norm(x, w, eps)

    def rope_table(self, max_positions, head_dim, theta, device):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
        return inv_freq

    def apply_rope(self, x, positions, table):  # table: this route's rope_table, inv_freq
        freqs = positions.float()[:, None] * table[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
        return x * cos + _rotate_half(x) * sin

    def qk_norm_rope(self, qk, q_weight, k_weight, eps, positions, table, n_q):
        return _qk_norm_rope_parts(self, qk, q_weight, k_weight, eps, positions, table, n_q)

    def swiglu(self, gate_up):
        g, u = gate_up.chunk(2, dim=-1)
        return F.silu(g) * u

    def attn_varlen(self, q, k, v, cu_seqlens, max_seqlen, scale):
        outs = []
        cu = cu_seqlens.tolist()
        for b in range(len(cu) - 1):
            s, e = cu[b], cu[b + 1]
            qb, kb, vb = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs, 0)

    def prepare_paged(self, meta: PagedMeta) -> PagedMeta:
        """Builds gather indices once per step: decode rows batched, prefill chunks one by one.

        Eager steps read lengths from ``meta.host_cu`` / ``meta.host_lens`` when given (else from
        the device). A ``padded_decode`` step reads nothing back: see :meth:`_prepare_padded_decode`.
        """
        if meta.padded_decode:
            return self._prepare_padded_decode(meta)
        cu = meta.host_cu if meta.host_cu is not None else meta.cu_seqlens_q.tolist()
        lens = meta.host_lens if meta.host_lens is not None else meta.seq_lens_kv.tolist()
        bs = meta.block_size
        dev = meta.block_tables.device
        dec = [b for b in range(len(lens)) if cu[b + 1] - cu[b] == 1]
        pre = [b for b in range(len(lens)) if cu[b + 1] - cu[b] > 1]
        info = {"decode": None, "prefill": []}
        if dec:
            lmax = max(lens[b] for b in dec)
            j = torch.arange(lmax, device=dev)
            bt = meta.block_tables[dec].long()
            L = torch.tensor([lens[b] for b in dec], device=dev)
            jj = torch.minimum(j[None, :], (L - 1)[:, None])
            slots = bt.gather(1, jj // bs) * bs + jj % bs  # [Bd, lmax]
            mask = j[None, :] < L[:, None]
            rows = torch.tensor([cu[b] for b in dec], device=dev)
            info["decode"] = (rows, slots, mask[:, None, None, :])
        for b in pre:
            L, n = lens[b], cu[b + 1] - cu[b]
            j = torch.arange(L, device=dev)
            slots = meta.block_tables[b].long()[j // bs] * bs + j % bs
            qpos = torch.arange(L - n, L, device=dev)
            mask = j[None, :] <= qpos[:, None]
            info["prefill"].append((cu[b], cu[b + 1], slots, mask[None, None]))
        meta.native = info
        return meta

    def _prepare_padded_decode(self, meta: PagedMeta) -> PagedMeta:
        """Static shapes, no host reads (capturable): every row is one query; keys gathered over
        the whole block-table width ``[P, nb * block_size]`` with the mask ``j < seq_lens_kv[b]``
        built on the device.

        A padding row (kv length 0) would have an all-False mask row (SDPA gives NaN there); it is
        given key 0 instead and its output set to 0 afterwards (as ``attn.v2`` gives), so no NaN
        is produced at all. Its K/V write (slot -1) is redirected to the first real row's slot
        with that row's own values: duplicate writes of identical bytes, so the order of the
        writes does not matter and no other slot is touched.
        """
        bs = meta.block_size
        bt = meta.block_tables.long()  # [P, nb]; zeros past each sequence's pages
        dev = bt.device
        j = torch.arange(bt.shape[1] * bs, device=dev)
        slots = bt[:, j // bs] * bs + j % bs  # [P, cap]
        L = meta.seq_lens_kv.long()
        mask = j[None, :] < torch.clamp(L, min=1)[:, None]
        sm = meta.slot_mapping
        valid = sm >= 0
        first = torch.argmax(valid.to(torch.int32))  # first real row (a padded step has at least one)
        src = torch.where(valid, torch.arange(sm.shape[0], device=dev), first)
        meta.native = {"decode": None, "prefill": [], "padded": (slots, mask[:, None, None, :], L > 0),
                       "write": (src, sm[src])}
        return meta

    def write_kv(self, k, v, k_cache, v_cache, meta: PagedMeta):
        Hk, D = k.shape[1], k.shape[2]
        w = (meta.native or {}).get("write")
        if w is None:
            k_cache.view(-1, Hk, D)[meta.slot_mapping] = k
            v_cache.view(-1, Hk, D)[meta.slot_mapping] = v
        else:  # padded decode: slot -1 rows rewrite a real row's slot with its own bytes
            src, slots = w
            k_cache.view(-1, Hk, D)[slots] = k[src]
            v_cache.view(-1, Hk, D)[slots] = v[src]

    def attn_paged(self, q, k_cache, v_cache, meta: PagedMeta, scale):
        Hk, D = k_cache.shape[2], k_cache.shape[3]
        kf, vf = k_cache.view(-1, Hk, D), v_cache.view(-1, Hk, D)
        info = meta.native
        if "padded" in info:
            slots, mask, live = info["padded"]
            kb, vb = kf[slots].transpose(1, 2), vf[slots].transpose(1, 2)  # [P, Hk, cap, D]
            o = F.scaled_dot_product_attention(q[:, :, None, :], kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
            return o[:, :, 0, :].masked_fill(~live[:, None, None], 0)
        out = torch.empty_like(q)
        if info["decode"] is not None:
            rows, slots, mask = info["decode"]
            qb = q[rows][:, :, None, :]  # [Bd, Hq, 1, D]
            kb, vb = kf[slots].transpose(1, 2), vf[slots].transpose(1, 2)  # [Bd, Hk, L, D]
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
            out[rows] = o[:, :, 0, :]
        for s, e, slots, mask in info["prefill"]:
            qb = q[s:e].transpose(0, 1)[None]
            kb, vb = kf[slots].transpose(0, 1)[None], vf[slots].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
            out[s:e] = o[0].transpose(0, 1)
        return out

    def logits(self, hidden, w, vocab_real=None):
        lg = F.linear(hidden, w)
        return lg[:, :vocab_real] if vocab_real is not None else lg

    def logp(self, hidden, w, targets, vocab_real=None):
        lp = torch.log_softmax(self.logits(hidden, w, vocab_real).float(), dim=-1)
        return lp.gather(1, targets[:, None]).squeeze(1)

    def logits_and_stats(self, hidden, w, vocab_real=None):
        return self.logits(hidden, w, vocab_real).float(), None

    def logp_from_logits(self, logits, stats, tokens):  # stats is None: log_softmax recomputes
        return torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)


def logp_segmentation(vocab_size: int | None):
    """``logp.v2``'s vocabulary segmentation (a bit field: both patterns must use the same).

    The contract default (ALIGN 18992, SEG_V 256) fits Qwen3's 151936 columns; a small test
    vocabulary uses the contract's (128, 128) pair instead (the default would launch 75 mostly
    empty segments per row block, which the CPU interpreter pays for).
    """
    if vocab_size is None or vocab_size >= 18992:
        return None
    return (128, 128)


def make_ops(route: str, vocab_size: int | None = None):
    if route == "strict":
        return StrictOps(vocab_size)
    if route == "native":
        return NativeOps()
    raise UnsupportedConfigError(f"unknown route {route!r} (known: {ROUTES})")
