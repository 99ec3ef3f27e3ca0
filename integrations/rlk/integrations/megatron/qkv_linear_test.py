"""megatron's ``linear_qkv`` slot computes over rlk's ``[Q|K|V]`` rows: the GEMM gets the
trainer's row order (so dx reduces as rlk's trainer does), the output keeps megatron's
interleaved columns, the gradients map back exactly (signed zeros too)."""

import types

import torch

from rlk.integrations.megatron import modules as M
from rlk.integrations.megatron.testing import require_megatron
from rlk.models.qwen3 import Qwen3Config
from rlk.models.qwen3.layouts import qkv_megatron_to_vllm, qkv_vllm_to_megatron


def _layer(cfg):
    conf = types.SimpleNamespace(num_query_groups=cfg.num_key_value_heads, num_attention_heads=cfg.num_attention_heads,
                                 kv_channels=cfg.head_dim, params_dtype=torch.bfloat16, use_cpu_initialization=True,
                                 perform_initialization=False)
    out = cfg.q_size + 2 * cfg.kv_size
    return M.RlkQKVLinear(cfg.hidden_size, out, config=conf, init_method=lambda w: None)


def test_qkv_order_is_the_layout_inverse():
    cfg = Qwen3Config.named("qwen3-8b")
    rows = torch.arange(cfg.q_size + 2 * cfg.kv_size).view(-1, 1)
    meg = qkv_vllm_to_megatron(cfg, rows).view(-1)  # megatron row p holds [Q|K|V] row meg[p]
    order = M.qkv_order(cfg.num_key_value_heads, cfg.group_size, cfg.head_dim)
    assert torch.equal(meg[order], torch.arange(rows.numel()))
    assert torch.equal(qkv_megatron_to_vllm(cfg, rows).view(-1), order)


def test_gemm_sees_qkv_rows_and_gradients_map_back(monkeypatch):
    require_megatron()
    from rlk.integrations.megatron import spec
    from rlk.kernels.gemm import autograd as gemm

    spec.init_parallel(1)
    cfg = Qwen3Config.named("tiny")
    lin = _layer(cfg)
    g = torch.Generator().manual_seed(0)
    w_qkv = (torch.randn(lin.weight.shape, generator=g) * 0.1).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(qkv_vllm_to_megatron(cfg, w_qkv))  # the checkpoint layout
    seen = []
    real = gemm.linear
    monkeypatch.setattr(gemm, "linear", lambda x, w, *a, **k: seen.append(w.detach().clone()) or real(x, w, *a, **k))
    x = torch.randn(5, cfg.hidden_size, generator=g).to(torch.bfloat16).requires_grad_()
    y, bias = lin(x)
    assert bias is None and len(seen) == 1 and torch.equal(seen[0], w_qkv)  # the GEMM runs on [Q|K|V] rows
    ref = real(x.detach(), lin.weight.detach())  # the interleaved weight as stored: same columns
    assert torch.equal(y, ref)
    dy = torch.randn(y.shape, generator=g).to(torch.bfloat16)
    dy[0, 3] = -0.0
    y.backward(dy)
    # Reference: rlk's trainer arithmetic over [Q|K|V] rows, mapped to megatron's rows.
    xr, wr = x.detach().clone().requires_grad_(), w_qkv.clone().requires_grad_()
    real(xr, wr).backward(qkv_megatron_to_vllm(cfg, dy.t().contiguous()).t().contiguous())
    assert torch.equal(x.grad, xr.grad)
    assert torch.equal(lin.weight.grad.view(torch.int16), qkv_vllm_to_megatron(cfg, wr.grad).view(torch.int16))


def test_permute_keeps_negative_zero():
    t = torch.tensor([[1.0, -0.0, 2.0]], requires_grad=True)
    idx, inv = torch.tensor([2, 0, 1]), torch.tensor([1, 2, 0])
    out = M._Permute.apply(t, 1, idx, inv)
    out.backward(torch.tensor([[-0.0, 5.0, -0.0]]))
    assert torch.equal(t.grad.view(torch.int32), torch.tensor([[5.0, -0.0, -0.0]]).view(torch.int32))
