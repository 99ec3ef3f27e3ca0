"""The public ops' direct-launch path (no autograd, not tracing) gives the custom op's bytes.

Each public op is called three ways on the same inputs: under ``torch.no_grad`` (direct launch),
through its ``torch.ops.rlk`` custom op, and with an input that requires grad (custom op, with a
backward that runs). The outputs must be byte-identical; a spy checks which path ran.
"""

import pytest
import torch

from rlk.kernels import dispatch
from rlk.kernels.attention import autograd as attention
from rlk.kernels.gemm import autograd as gemm
from rlk.kernels.linear_logp import autograd as linear_logp
from rlk.kernels.rowops import autograd as rowops
from rlk.testing import assert_bitwise_equal


def _bf16(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)


def test_direct_predicate():
    x = _bf16(2, 64)
    assert dispatch.direct(x, None)
    y = x.clone().requires_grad_(True)
    assert not dispatch.direct(x, y)
    with torch.no_grad():
        assert dispatch.direct(x, y)
    assert dispatch.direct(torch.nn.Parameter(x, requires_grad=False))
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _Seen():
        assert not dispatch.direct(x)


def _three_ways(fn, make_inputs, grad_index, op_call):
    """(direct, custom op, autograd) outputs of fn on the same inputs."""
    ins = make_inputs()
    with torch.no_grad():
        direct = fn(*ins)
    with torch.no_grad():
        via_op = op_call(*ins)
    g_ins = list(make_inputs())
    g_ins[grad_index] = g_ins[grad_index].clone().requires_grad_(True)
    with torch.enable_grad():
        via_grad = fn(*g_ins)
        first = via_grad[0] if isinstance(via_grad, tuple) else via_grad
        first.float().sum().backward()
    assert g_ins[grad_index].grad is not None
    return direct, via_op, via_grad


def _eq(a, b, what):
    if isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            if x is not None:
                _eq(x, y, f"{what}[{i}]")
        return
    assert_bitwise_equal(a.detach(), b.detach(), what)


@pytest.mark.parametrize("name", ["rms_norm", "add_rms_norm", "rope", "swiglu", "embedding", "linear"])
def test_rowops_and_gemm_direct_equals_custom_op(name):
    H = 64
    if name == "rms_norm":
        fn, mk, gi = (lambda x, w: rowops.rms_norm(x, w, 1e-6)), (lambda: (_bf16(5, H, seed=1), _bf16(H, seed=2))), 0
        op = lambda x, w: torch.ops.rlk.rms_norm(x, w, 1e-6)  # noqa: E731
    elif name == "add_rms_norm":
        fn = lambda x, r, w: rowops.add_rms_norm(x, r, w, 1e-6)  # noqa: E731
        mk, gi = (lambda: (_bf16(5, H, seed=1), _bf16(5, H, seed=3), _bf16(H, seed=2))), 0
        op = lambda x, r, w: torch.ops.rlk.add_rms_norm(x, r, w, 1e-6)  # noqa: E731
    elif name == "rope":
        cos, sin = rowops.rope_table(32, 16, 10000.0)
        fn = lambda x, p: rowops.apply_rope(x, p, cos, sin)  # noqa: E731
        mk, gi = (lambda: (_bf16(5, 2, 16, seed=4), torch.tensor([0, 3, 7, 1, 31]))), 0
        op = lambda x, p: torch.ops.rlk.apply_rope(x, p, cos, sin, False)  # noqa: E731
    elif name == "swiglu":
        fn, mk, gi = rowops.swiglu, (lambda: (_bf16(5, 2 * H, seed=5),)), 0
        op = torch.ops.rlk.swiglu
    elif name == "embedding":
        fn, mk, gi = rowops.embedding, (lambda: (torch.tensor([3, 0, 9, 3]), _bf16(10, H, seed=6))), 1
        op = torch.ops.rlk.embedding
    else:
        fn, mk, gi = gemm.linear, (lambda: (_bf16(5, H, seed=7), _bf16(32, H, seed=8, scale=0.1))), 0
        op = lambda x, w: torch.ops.rlk.gemm(x, w, False)  # noqa: E731
    d, o, g = _three_ways(fn, mk, gi, op)
    _eq(d, o, f"{name}: direct vs custom op")
    _eq(d, g, f"{name}: direct vs autograd path")


def test_attention_direct_equals_custom_op():
    q, k, v = _bf16(12, 4, 16, seed=9), _bf16(12, 2, 16, seed=10), _bf16(12, 2, 16, seed=11)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with torch.no_grad():
        d = attention.varlen_attention_with_lse(q, k, v, cu, 7, 0.25)
        o = torch.ops.rlk.attn_varlen_fwd(q, k, v, cu, 7, 0.25)
    _eq(d, o, "attention: direct vs custom op")


def test_linear_logp_direct_equals_custom_op(monkeypatch):
    from rlk.kernels.linear_logp import launch

    h, w = _bf16(6, 64, seed=12), _bf16(100, 64, seed=13, scale=0.2)
    tg = torch.tensor([0, 5, 96, 42, 7, 7])
    calls = []
    real = launch.linear_logp_fwd
    monkeypatch.setattr(launch, "linear_logp_fwd", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        d = linear_logp.linear_logp(h, w, tg, vocab_real=97, return_entropy=True, segmentation=(64, 32))
        o = torch.ops.rlk.linear_logp_fwd(h, w, tg, 0, 97, 1.0, True, False, 64, 32)
    assert len(calls) == 2  # once directly, once inside the custom op
    for i, name in enumerate(("logp", "lse", "entropy")):
        assert_bitwise_equal(getattr(d, name), o[i], f"linear_logp {name}: direct vs custom op")
    with pytest.raises(Exception, match="outside"):
        with torch.no_grad():
            linear_logp.linear_logp(h, w, torch.tensor([0, 1, 2, 3, 4, 98]), vocab_real=97, segmentation=(64, 32))
