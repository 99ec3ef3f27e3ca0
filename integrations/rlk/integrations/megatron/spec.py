"""Strict spec provider: a megatron-core ``GPTModel`` for a Qwen3 config with rlk in every slot.

* :func:`transformer_config` maps a Qwen3 config (Hugging Face ``config.json``) to megatron's
  ``TransformerConfig`` with every fusion off, ``transformer_impl="local"``, no dropout, bf16.
* :func:`check_config` is the fail-closed guard: it raises ``UnsupportedConfigError`` for any
  setting the rlk contracts do not cover (TE spec, fused kernels, sequence parallel, fp8,
  dropout, CP outside {1, 2, 4, 8} or with a non-all-gather ``cp_comm_type``, head/TP counts
  that do not divide, biases, ...).
* Context parallelism (CP > 1) runs without TransformerEngine: megatron's local
  ``DotProductAttention`` asserts CP == 1, so the CP attention is rlk's own core attention in
  the slot (``rlk.nn.context_parallel``: zigzag CP-local rows, ``ag.v1`` K/V gather,
  ``attn.v2`` rows equal to CP=1). The caller splits the packed batch per CP rank as
  megatron's ``get_batch_on_this_cp_rank`` does (:func:`cp_token_index`; megatron calls
  TransformerEngine's ``thd_get_partitioned_indices`` for the same zigzag indices) and keeps the
  global ``cu_seqlens`` in ``PackedSeqParams``.
* :func:`layer_spec` is the ``TransformerLayer`` spec with the adapters of
  :mod:`rlk.integrations.megatron.modules` in every compute slot.
* :func:`build_gpt_model` builds the model, swaps the word embedding for rlk's, makes megatron's
  output layer a weight holder (its forward raises: logits come only from the output
  processor), and runs the post-build audit (:mod:`rlk.integrations.megatron.audit`).

megatron-core 0.19.2 is imported lazily; ``parallel_state`` must be initialized first
(:func:`init_parallel`).
"""

from __future__ import annotations

import torch

from rlk.contracts import STRICT_CONTRACTS
from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.modules import (  # noqa: F401 - the CP layout's public names here too
    CP_COMM_TYPES,
    CP_SIZES,
    check_cp_lengths,
    cp_token_index,
)
from rlk.models.qwen3.config import Qwen3Config
from rlk.models.qwen3.routes import MODEL_OPS

MEGATRON_VERSION = "0.19.2"

# Contract IDs of the arithmetic this provider puts in megatron's slots: the strict model's, plus
# the fixed-order collectives of the TP layers (docs/API.md), all from rlk.contracts.STRICT_CONTRACTS.
CONTRACTS = {op: STRICT_CONTRACTS[op] for op in (*MODEL_OPS, "all_reduce", "all_gather")}

# TransformerConfig fields the guard pins: name -> the only accepted value.
_PINNED = {
    "transformer_impl": "local",
    "normalization": "RMSNorm",
    "gated_linear_unit": True,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "qk_layernorm": True,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "sequence_parallel": False,
    "pipeline_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "fp8": None,
    "fp4": None,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "apply_rope_fusion": False,
    "persist_layer_norm": False,
    "gradient_accumulation_fusion": False,
    "cross_entropy_loss_fusion": False,
    "fp32_residual_connection": False,
    "apply_residual_connection_post_layernorm": False,
    "use_te_activation_func": True,
    "bf16": True,
    "fp16": False,
    "params_dtype": torch.bfloat16,
    "num_moe_experts": None,
    "multi_latent_attention": False,
    "layernorm_zero_centered_gamma": False,
    "qk_l2_norm": False,
    "use_mup": False,
    "hierarchical_context_parallel_sizes": None,
    "hybrid_context_parallel": False,
}

# Activation recompute covered: megatron re-runs the same rlk modules in backward (the same
# bytes: every contract is run-to-run bitwise), "full" for whole layers or "selective" for the
# core attention only; other selective modules are untested here.
RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_SELECTIVE_MODULES = ("core_attn",)


def _swiglu_marker(x):  # pragma: no cover - never called: the activation slot holds RlkSwiGLU
    raise UnsupportedConfigError("config.activation_func called: the activation slot must be RlkSwiGLU")


def transformer_config(cfg: Qwen3Config, tp: int = 1, cp: int = 1, **overrides):
    """megatron ``TransformerConfig`` for ``cfg`` at TP=``tp``, CP=``cp`` under strict settings
    (then :func:`check_config`)."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    import torch.nn.functional as F

    kw = dict(
        num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim, layernorm_epsilon=cfg.rms_norm_eps, activation_func=F.silu,
        tensor_model_parallel_size=tp, context_parallel_size=cp, use_cpu_initialization=True,
        init_method_std=0.02,
    )
    kw.update({k: v for k, v in _PINNED.items() if k not in ("fp4", "qk_l2_norm", "use_mup")})
    kw.update(overrides)
    tc = TransformerConfig(**kw)
    check_config(cfg, tc)
    return tc


def check_config(cfg: Qwen3Config, tc, tp_size: int | None = None) -> None:
    """Raises ``UnsupportedConfigError`` naming every setting of ``tc`` outside the contracts."""
    bad = []
    for k, want in _PINNED.items():
        if not hasattr(tc, k):
            continue
        got = getattr(tc, k)
        if got != want:
            bad.append(f"{k}={got!r} (strict needs {want!r})")
    tp = tc.tensor_model_parallel_size if tp_size is None else tp_size
    if tp < 1 or cfg.num_key_value_heads % tp or cfg.num_attention_heads % tp:
        bad.append(f"TP={tp} must divide num_key_value_heads={cfg.num_key_value_heads} and "
                   f"num_attention_heads={cfg.num_attention_heads}")
    if tp >= 1 and (cfg.intermediate_size % tp or cfg.vocab_size % tp):
        bad.append(f"TP={tp} must divide intermediate_size={cfg.intermediate_size} and vocab_size={cfg.vocab_size}")
    for name, mine in (("num_layers", cfg.num_hidden_layers), ("hidden_size", cfg.hidden_size),
                       ("ffn_hidden_size", cfg.intermediate_size), ("num_attention_heads", cfg.num_attention_heads),
                       ("num_query_groups", cfg.num_key_value_heads), ("kv_channels", cfg.head_dim)):
        if getattr(tc, name) != mine:
            bad.append(f"{name}={getattr(tc, name)} but the Qwen3 config says {mine}")
    cp = getattr(tc, "context_parallel_size", 1)
    if cp not in CP_SIZES:
        bad.append(f"context_parallel_size={cp!r} (strict covers CP in {CP_SIZES}: rlk.nn.context_parallel's "
                   "zigzag CP-local-row attention)")
    elif cp > 1:
        comm = getattr(tc, "cp_comm_type", None)
        if any(c not in CP_COMM_TYPES for c in (comm if isinstance(comm, list) else [comm])):
            bad.append(f"cp_comm_type={comm!r} (rlk's CP attention all-gathers K/V with ag.v1: None or 'all_gather')")
    gran = getattr(tc, "recompute_granularity", None)
    if gran not in RECOMPUTE_GRANULARITIES:
        bad.append(f"recompute_granularity={gran!r} (strict covers {RECOMPUTE_GRANULARITIES})")
    elif gran == "selective":
        mods = sorted(set(getattr(tc, "recompute_modules", None) or []) - set(RECOMPUTE_SELECTIVE_MODULES))
        if mods:
            bad.append(f"recompute_modules {mods} (strict's selective recompute covers {RECOMPUTE_SELECTIVE_MODULES})")
    if getattr(tc, "virtual_pipeline_model_parallel_size", None) not in (None, 1):
        bad.append("virtual pipeline parallelism is not covered")
    if getattr(tc, "fp8_param", False):
        bad.append("fp8 parameters are not covered")
    if bad:
        raise UnsupportedConfigError("megatron strict config: " + "; ".join(bad))


def layer_spec(cfg: Qwen3Config):
    """``ModuleSpec(TransformerLayer)`` with rlk adapters in every compute slot."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    from rlk.integrations.megatron import modules as M

    core = ModuleSpec(module=M.RlkCoreAttention,
                      params={"rope_theta": cfg.rope_theta, "max_positions": cfg.max_position_embeddings})
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=M.RlkRMSNorm,
            self_attention=ModuleSpec(
                module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=M.RlkQKVLinear, core_attention=core,
                    linear_proj=M.RlkRowParallelLinear, q_layernorm=M.RlkRMSNorm, k_layernorm=M.RlkRMSNorm)),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=M.RlkRMSNorm,
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(
                linear_fc1=M.RlkColumnParallelLinear, linear_fc2=M.RlkRowParallelLinear,
                activation_func=M.RlkSwiGLU)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def block_spec(cfg: Qwen3Config):
    """``TransformerBlockSubmodules`` (the final norm is rlk's too)."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from rlk.integrations.megatron import modules as M

    ls = layer_spec(cfg)
    return TransformerBlockSubmodules(layer_specs=[ls] * cfg.num_hidden_layers, layer_norm=M.RlkRMSNorm)


def _output_layer_forward_forbidden(module, args):
    raise UnsupportedConfigError("strict GPTModel: output_layer.forward ran (megatron's own logits); "
                                 "call the model with output_processor=rlk.integrations.megatron.logp.output_processor")


def build_gpt_model(cfg: Qwen3Config, tp: int = 1, audit: bool = True, *, cp: int = 1, **config_overrides):
    """A strict megatron-core ``GPTModel`` for ``cfg`` (parallel state initialized at TP=``tp``,
    CP=``cp``). At CP > 1 each rank's forward takes its zigzag token rows (:func:`cp_token_index`)
    with the global ``cu_seqlens``.

    Returns the model (bf16 parameters, CPU or the current CUDA device per the config). The
    word embedding is rlk's; ``output_layer``'s weight is the LM head the output processor
    reads, and its forward raises. ``audit`` runs :func:`rlk.integrations.megatron.audit.audit_model`.

    Determinism: the contracts in :data:`CONTRACTS`.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from rlk.integrations.megatron import audit as A
    from rlk.integrations.megatron.modules import RlkVocabParallelEmbedding

    if not ps.model_parallel_is_initialized():
        raise UnsupportedConfigError("build_gpt_model: initialize parallel state first (init_parallel)")
    if ps.get_tensor_model_parallel_world_size() != tp:
        raise UnsupportedConfigError(f"build_gpt_model: TP={tp} but parallel state has "
                                     f"{ps.get_tensor_model_parallel_world_size()}")
    if ps.get_context_parallel_world_size() != cp:
        raise UnsupportedConfigError(f"build_gpt_model: CP={cp} but parallel state has "
                                     f"{ps.get_context_parallel_world_size()}")
    tc = transformer_config(cfg, tp, cp, **config_overrides)
    model = GPTModel(config=tc, transformer_layer_spec=block_spec(cfg), vocab_size=cfg.vocab_size,
                     max_sequence_length=cfg.max_position_embeddings, pre_process=True, post_process=True,
                     parallel_output=True, share_embeddings_and_output_weights=cfg.tie_word_embeddings,
                     position_embedding_type="none")
    emb = model.embedding
    emb.word_embeddings = RlkVocabParallelEmbedding(emb.word_embeddings.weight, ps.get_tensor_model_parallel_group())
    if model.output_layer is not None:
        model.output_layer.register_forward_pre_hook(_output_layer_forward_forbidden)
    model.rlk_contracts = dict(CONTRACTS)
    if audit:
        A.audit_model(model)
    return model


def init_parallel(tp: int = 1, cp: int = 1) -> None:
    """Initializes torch.distributed (gloo on CPU, env:// rendezvous; a single process at TP=1
    when nothing is set) and megatron's parallel state at TP=``tp``, CP=``cp`` (megatron's rank
    order: TP fastest, then CP)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rlk import determinism

    if not dist.is_initialized():
        determinism.single_process_rendezvous_defaults()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if cp not in CP_SIZES:
        raise UnsupportedConfigError(f"init_parallel: CP={cp} (strict covers CP in {CP_SIZES})")
    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() == tp and ps.get_context_parallel_world_size() == cp:
            return
        ps.destroy_model_parallel()
    if dist.get_world_size() % (tp * cp):
        raise UnsupportedConfigError(f"init_parallel: world size {dist.get_world_size()} not divisible by "
                                     f"TP={tp} x CP={cp}")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
