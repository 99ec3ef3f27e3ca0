"""megatron-core's native trainer: what a megatron user trains a Qwen3 model with when rlk is not
in the loop, the baseline of the actor benchmark, the production pair's P/P trainer and the RL
loop's native arm.

:class:`NativeActor`: megatron's ``GPTModel`` on ``get_gpt_layer_local_spec(qk_layernorm=True,
normalization="RMSNorm")`` (torch RMSNorm, megatron's RoPE with ``rope_theta``, SwiGLU, the
fusions that need Apex or TransformerEngine off), bf16 through ``Float16Module`` as megatron's
training wraps it, megatron's DDP (fp32 ``main_grad``) and Adam (``actor.training_wrappers``),
logp = -(megatron's per-token cross entropy over materialized fp32 logits). Its core attention is
megatron's local ``DotProductAttention`` on ``[b, s]`` with a causal mask (equal-length
sequences: :meth:`NativeActor.forward_backward`) unless ``core_attention`` fills the slot, e.g.
:class:`rlk.integrations.megatron.varlen_attention.VarlenCoreAttention` for packed ``thd`` sequences
(:meth:`NativeActor.forward_backward_packed`). Weights in megatron's naming (``weights.hf_to_megatron``),
loaded fail-closed (every parameter covered).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.host_emulation import cuda_names_on_cpu

# Adam's learning rate when the caller names none (the actor benchmark's).
DEFAULT_LR = 1e-5

# rlk's megatron names -> the local spec's (identical in megatron-core 0.19.2: torch RMSNorm and
# megatron's linears keep ".weight"); listed so a rename fails closed in weights.load_into.
NATIVE_RENAMES: dict[str, str] = {}


def native_model(cfg, device: str, recompute: Optional[str] = None, core_attention=None):
    """megatron-core's local-spec GPTModel (module docstring) on ``device``, bf16 through
    ``Float16Module``; returns ``(Float16Module, TransformerConfig)``. ``core_attention``: a
    class for the spec's core-attention slot instead of megatron's local ``DotProductAttention``."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from rlk.integrations.megatron.actor import _RECOMPUTE

    if recompute not in _RECOMPUTE:
        raise UnsupportedConfigError(f"native: recompute={recompute!r} (covered: {sorted(map(str, _RECOMPUTE))})")
    on_gpu = torch.device(device).type == "cuda"
    tc = TransformerConfig(
        num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim, layernorm_epsilon=cfg.rms_norm_eps, normalization="RMSNorm", qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16, transformer_impl="local",
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        cross_entropy_loss_fusion=False, calculate_per_token_loss=True, tensor_model_parallel_size=1,
        use_cpu_initialization=not on_gpu, perform_initialization=False, **_RECOMPUTE[recompute])
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    if core_attention is not None:
        layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    model = GPTModel(config=tc, transformer_layer_spec=layer_spec,
                     vocab_size=cfg.vocab_size, max_sequence_length=cfg.max_position_embeddings, pre_process=True,
                     post_process=True, parallel_output=True,
                     share_embeddings_and_output_weights=cfg.tie_word_embeddings, position_embedding_type="rope",
                     rotary_base=cfg.rope_theta)
    return Float16Module(tc, model).to(torch.device(device)), tc


def native_state(cfg, hf) -> dict[str, torch.Tensor]:
    """Hugging Face tensors -> the local spec's parameter names (TP=1)."""
    from rlk.integrations.megatron import weights

    sd = weights.hf_to_megatron(cfg, hf, 1, 0)
    out = {}
    for k, t in sd.items():
        for old, new in NATIVE_RENAMES.items():
            k = k.replace(old, new)
        out[k] = t
    return out


def packed_seq_params(pk):
    """megatron's ``PackedSeqParams`` (``thd``) of a packed batch (``rlk.replay.trainer.pack``)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = pk.cu_seqlens.to(torch.int32)
    host_cu = pk.host_cu if pk.host_cu is not None else cu.tolist()
    ms = max(b - a for a, b in zip(host_cu, host_cu[1:]))
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=ms, max_seqlen_kv=ms)


class NativeActor:
    """megatron's native trainer (module docstring). ``f16``: the ``Float16Module`` megatron
    trains, ``model``: its GPTModel, ``ddp``, ``optimizer`` (None with ``optimizer=False``: DDP
    ``main_grad`` buffers only, :meth:`step` refuses). ``optimizer_offload``, ``lr``, ``betas``:
    megatron's Adam (``actor.training_wrappers``)."""

    def __init__(self, cfg, hf, *, device: str, recompute: Optional[str] = None, core_attention=None,
                 optimizer: bool = True, optimizer_offload=0.0, lr: float = DEFAULT_LR,
                 betas: tuple[float, float] = (0.9, 0.999)):
        from megatron.core import tensor_parallel

        from rlk.integrations.megatron import spec, weights
        from rlk.integrations.megatron.actor import training_wrappers

        self.optimizer_offload = optimizer_offload if optimizer else 0.0
        spec.init_parallel(1)
        self.on_gpu = torch.device(device).type == "cuda"
        if self.on_gpu:  # local DotProductAttention forks megatron's model-parallel CUDA RNG (dropout)
            tensor_parallel.model_parallel_cuda_manual_seed(0)
        with cuda_names_on_cpu():
            self.f16, tc = native_model(cfg, device, recompute, core_attention)
        self.model = self.f16.module
        weights.load_into(self.model, native_state(cfg, hf))  # fail closed: every parameter covered
        _, _, self.ddp, self.optimizer = training_wrappers(
            self.f16, tc, lr=lr, betas=tuple(betas), eps=1e-8, optimizer=optimizer,
            optimizer_offload=self.optimizer_offload)

    def forward_backward(self, pk, loss, seqs: int, micro_batches: int = 1) -> torch.Tensor:
        """One forward + backward of the batch's ``seqs`` equal-length sequences in
        ``micro_batches`` micro-batches of ``seqs / micro_batches`` sequences (megatron's
        ``micro_batch_size``, gradients accumulated in ``main_grad``, losses summed:
        ``calculate_per_token_loss``); returns the logp ``[T]`` in packed order."""
        if micro_batches < 1 or seqs % micro_batches:
            raise UnsupportedConfigError(f"native: {seqs} sequences do not split into {micro_batches} micro-batches")
        T = pk.ids.shape[0]
        tokens, labels = pk.ids.view(seqs, T // seqs), pk.targets.view(seqs, T // seqs)
        S, b = T // seqs, seqs // micro_batches
        pos = torch.arange(S, device=tokens.device).expand(b, -1)
        # Causal mask as megatron's pretrain_gpt builds it (get_ltor_masks_and_position_ids): True = masked.
        mask = torch.triu(torch.ones(S, S, dtype=torch.bool, device=tokens.device), diagonal=1).view(1, 1, S, S)
        logps = []

        def forward_step(data_iterator, model):
            j = next(data_iterator)
            lo, hi = j * b * S, (j + 1) * b * S  # this micro-batch's rows of the packed batch
            ce = model(tokens[j * b:(j + 1) * b], pos, mask, labels=labels[j * b:(j + 1) * b])  # [b, s] fp32 CE
            logp = -ce.reshape(hi - lo)
            logps.append(logp.detach())
            return loss(logp, lo, hi).sum(), lambda out: (out, torch.tensor(hi - lo, dtype=torch.int),
                                                          {"loss": out.detach()})

        self._schedule(forward_step, iter(range(micro_batches)), micro_batches, S, b)
        return torch.cat(logps)

    def packed_logp(self, model, pk) -> torch.Tensor:
        """logp ``[T]`` (fp32) of a packed ``thd`` batch through ``model`` (the ``Float16Module``
        or megatron's DDP around it); needs a ``core_attention`` that takes packed sequences."""
        T = pk.ids.shape[0]
        ce = model(pk.ids.view(1, T), None, None, labels=pk.targets.view(1, T), packed_seq_params=packed_seq_params(pk))
        return -ce.reshape(T)  # megatron's per-token cross entropy, fp32 [1, T]

    def forward_backward_packed(self, batches) -> list[torch.Tensor]:
        """Forward + backward of ``[(pk, token_loss)]`` micro-batches of packed sequences over
        megatron's no-pipelining schedule (gradients accumulated in ``main_grad``); returns each
        micro-batch's logp ``[T]``."""
        if not batches:
            raise UnsupportedConfigError("native forward_backward_packed: no micro-batches")
        logps = []

        def forward_step(data_iterator, model):
            pk, token_loss = next(data_iterator)
            T = pk.ids.shape[0]
            logp = self.packed_logp(model, pk)
            logps.append(logp.detach())
            return token_loss(logp, 0, T).sum(), lambda out: (out, torch.tensor(T, dtype=torch.int),
                                                             {"loss": out.detach()})

        self._schedule(forward_step, iter(batches), len(batches), 0, 1)
        return logps

    def _schedule(self, forward_step, data_iterator, num_microbatches: int, seq_length: int,
                  micro_batch_size: int) -> None:
        """megatron's no-pipelining forward + backward over the micro-batches, gradients zeroed
        first and accumulated in ``main_grad``."""
        from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining

        self.ddp.train()
        with cuda_names_on_cpu(), self._cpu_rng_fork():
            self.ddp.zero_grad_buffer()
            if self.optimizer is not None:
                self.optimizer.zero_grad()
            forward_backward_no_pipelining(forward_step_func=forward_step, data_iterator=data_iterator,
                                           model=[self.ddp], num_microbatches=num_microbatches,
                                           seq_length=seq_length, micro_batch_size=micro_batch_size,
                                           forward_only=False)

    @contextlib.contextmanager
    def _cpu_rng_fork(self):
        """Without CUDA there is no generator for megatron's RNG tracker; the attention dropout is
        0 (draws nothing), so on the CPU its ``fork()`` is a no-op context. Unused on a GPU."""
        if self.on_gpu:
            yield
            return
        from megatron.core import tensor_parallel

        tracker = tensor_parallel.get_cuda_rng_tracker()
        tracker.fork = lambda *a, **k: contextlib.nullcontext()
        try:
            yield
        finally:
            del tracker.fork

    def step(self) -> dict:
        """megatron's optimizer step; returns ``{"grad_norm"}`` as ``MegatronActor.step``."""
        from rlk.integrations.megatron.offload import checked_step

        return checked_step(self.optimizer, "the native actor")
