"""Fail-closed audits of the strict GPTModel.

* :func:`audit_model` (post-build): every module is rlk's (``modules.RLK_MODULES``), a megatron
  container whose own forward only routes tensors (views, the QKV split, bias-dropout-add with
  p = 0), or on a short allow-list; every parameter lives in an rlk module, except
  ``output_layer.weight`` (megatron's output layer is a weight holder: its forward raises, the
  output processor reads the weight). Anything else raises ``StrictAuditError``.
* :func:`forward_audit` (optional, a ``TorchDispatchMode``): raises on any floating-point aten
  compute op outside :data:`ALLOWED_ATEN` while the model runs; rlk's ops (``torch.ops.rlk.*``)
  pass through as opaque custom ops, and under the Triton interpreter their kernels run below
  the dispatcher (with the mode off), so only the glue megatron and the adapters run is seen.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlk.errors import UnsupportedConfigError


class StrictAuditError(UnsupportedConfigError):
    """A native compute module or op was found where strict mode allows only rlk's."""


def _containers():
    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_layer import TransformerLayer

    # Forward bodies: routing, views (QKV split), residual add (bias-dropout-add, p = 0).
    return (GPTModel, TransformerBlock, TransformerLayer, SelfAttention, MLP, LanguageModelEmbedding,
            torch.nn.ModuleList)


def _allowed_leaf(name: str, mod: torch.nn.Module) -> str | None:
    """Why ``mod`` is allowed as a non-rlk leaf, or None."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp

    if type(mod) in (IdentityOp, IdentityFuncOp):
        return "identity"
    if type(mod) is torch.nn.Dropout and mod.p == 0.0:
        return "dropout p=0 (identity)"
    if name == "output_layer" and type(mod) is ColumnParallelLinear and mod._forward_pre_hooks:
        return "weight holder (forward raises; logits come from the output processor)"
    return None


def audit_model(model: torch.nn.Module) -> list[tuple[str, str, str]]:
    """Checks every module of ``model``; returns ``[(name, class, verdict)]`` or raises
    ``StrictAuditError`` listing every offender."""
    from rlk.integrations.megatron.modules import RLK_MODULES

    containers = _containers()
    report, bad = [], []
    for name, mod in model.named_modules():
        cls = f"{type(mod).__module__}.{type(mod).__qualname__}"
        if isinstance(mod, RLK_MODULES) and type(mod).__module__.startswith("rlk."):
            report.append((name, cls, "rlk"))
            continue
        why = _allowed_leaf(name, mod)
        if why is not None:
            report.append((name, cls, why))
            continue
        if type(mod) in containers:
            own = [p for p, _ in mod.named_parameters(recurse=False)]
            if own:
                bad.append(f"{name or '<root>'} ({cls}) holds parameters {own} outside rlk modules")
            else:
                report.append((name, cls, "container"))
            continue
        bad.append(f"{name or '<root>'} ({cls}) is not an rlk module nor on the allow-list")
    for pname, _ in model.named_parameters():
        owner = pname.rsplit(".", 1)[0]
        if owner != "output_layer" and not isinstance(model.get_submodule(owner), RLK_MODULES):
            bad.append(f"parameter {pname} is not owned by an rlk module")
    if bad:
        raise StrictAuditError("strict megatron audit failed: " + "; ".join(bad))
    return report


# Floating-point aten ops the strict forward may run outside rlk ops: exact data movement
# (views, copies, concatenation, indexing), integer bookkeeping and the residual add of
# bias-dropout-add (one bf16 add, round to nearest even: the same bytes as rlk's add_rms_norm).
ALLOWED_ATEN = {
    "add.Tensor", "add_.Tensor",  # residual add (in place in eval mode) (bf16 + bf16, one rounding) and integer index arithmetic
    "sub.Tensor",  # integer positions (checked: floating use raises)
    "view.default", "_unsafe_view.default", "reshape.default", "transpose.int", "t.default", "permute.default",
    "expand.default", "unsqueeze.default", "squeeze.dim", "squeeze.dims", "split.Tensor", "split_with_sizes.default",
    "slice.Tensor", "select.int", "chunk.default", "unbind.int", "clone.default", "contiguous.default",
    "_to_copy.default", "copy_.default", "cat.default", "stack.default", "detach.default", "alias.default",
    "empty.memory_format", "empty_like.default", "new_empty.default", "zeros_like.default", "zeros.default",
    "full.default", "new_zeros.default", "ones_like.default", "fill_.Scalar", "zero_.default",
    "where.self", "index.Tensor", "index_select.default", "gather.default", "repeat_interleave.Tensor",
    "arange.default", "arange.start", "arange.start_step", "lift_fresh.default", "lift_fresh_copy.default",
    "eq.Tensor", "eq.Scalar", "ne.Scalar", "ge.Scalar", "lt.Scalar", "lt.Tensor", "bitwise_and.Tensor",
    "max.default", "min.default", "equal.default", "_local_scalar_dense.default", "item.default",
    "ones.default", "scalar_tensor.default", "sum.default", "mul.Tensor", "neg.default", "as_strided.default",
    "new_empty_strided.default", "empty_strided.default", "_has_compatible_shallow_copy_type.default",
}
# Ops allowed only on non-floating tensors (integer bookkeeping) or as the residual add.
_INT_ONLY = {"sub.Tensor", "sum.default", "mul.Tensor", "neg.default", "max.default", "min.default"}


def _is_float(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _desc(x):
    return f"{x.dtype}{tuple(x.shape)}" if isinstance(x, torch.Tensor) else repr(x)


def _residual_add(args, kwargs) -> bool:
    a, b = args[0], args[1] if len(args) > 1 else None
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.shape == b.shape and kwargs.get("alpha", 1) == 1)


class forward_audit(TorchDispatchMode):
    """Raises ``StrictAuditError`` on a floating-point aten op outside :data:`ALLOWED_ATEN`.

    rlk custom ops (namespace ``rlk``) and the collectives' transport are allowed. Use around
    the model call (forward and, optionally, backward)."""

    def __init__(self, extra_allowed=()):
        super().__init__()
        self.allowed = set(ALLOWED_ATEN) | set(extra_allowed)
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        name = func._opname + "." + func._overloadname
        if ns not in ("aten", "prims"):
            self.seen[f"{ns}::{name}"] = self.seen.get(f"{ns}::{name}", 0) + 1
            return func(*args, **kwargs)
        flat = list(args) + list(kwargs.values())
        flat = [x for a in flat for x in (a if isinstance(a, (list, tuple)) else (a,))]
        floating = any(_is_float(x) for x in flat)
        if floating and name in ("add.Tensor", "add_.Tensor") and not _residual_add(args, kwargs):
            raise StrictAuditError(f"strict forward audit: aten.{name} {[_desc(x) for x in args]} is not a "
                                   "residual add (same-shape same-dtype tensors, alpha 1)")
        if floating and (name not in self.allowed or name in _INT_ONLY):
            raise StrictAuditError(f"strict forward audit: aten.{name} on floating-point tensors is not allowed "
                                   "(native compute outside rlk ops)")
        self.seen[f"aten::{name}"] = self.seen.get(f"aten::{name}", 0) + 1
        return func(*args, **kwargs)
