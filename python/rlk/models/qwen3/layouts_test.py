"""Layout converters are exact (bitwise round trips) and put rows where each engine expects."""

import dataclasses

import pytest
import torch

from rlk.models.qwen3 import Qwen3Config, random_weights
from rlk.models.qwen3 import layouts as L
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")
# GQA group of 4, tied embeddings, odd sizes.
GQA = dataclasses.replace(TINY, num_attention_heads=8, num_key_value_heads=2, head_dim=8, hidden_size=48,
                          intermediate_size=40, vocab_size=50, tie_word_embeddings=True, num_hidden_layers=3)


def _same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert_bitwise_equal(a[k], b[k], k)


@pytest.mark.parametrize("cfg", [TINY, GQA], ids=["tiny", "gqa4-tied"])
def test_round_trips(cfg):
    hf = random_weights(cfg, seed=3)
    f = L.hf_to_fused(cfg, hf)
    _same(L.fused_to_hf(cfg, f), hf)
    m = L.fused_to_megatron(cfg, f)
    _same(L.megatron_to_fused(cfg, m), f)
    _same(L.vllm_to_fused(cfg, L.fused_to_vllm(cfg, f)), f)
    assert ("output_layer.weight" in m) == (not cfg.tie_word_embeddings)
    assert f["lm_head.weight"] is (hf["model.embed_tokens.weight"] if cfg.tie_word_embeddings else hf["lm_head.weight"])


def test_megatron_qkv_interleave_rows():
    cfg = GQA  # 8 q heads, 2 kv heads, D=8: group g holds q heads 4g..4g+3, then k_g, v_g
    D, r = cfg.head_dim, cfg.group_size
    q = torch.arange(cfg.num_attention_heads).repeat_interleave(D)  # q head h -> value h
    k = 100 + torch.arange(cfg.num_key_value_heads).repeat_interleave(D)
    v = 200 + torch.arange(cfg.num_key_value_heads).repeat_interleave(D)
    qkv = torch.cat([q, k, v]).float()[:, None].expand(-1, 3).contiguous()
    meg = L.qkv_vllm_to_megatron(cfg, qkv)[:, 0].reshape(-1, D)[:, 0].tolist()
    assert meg == [0, 1, 2, 3, 100, 200, 4, 5, 6, 7, 101, 201]
    assert_bitwise_equal(L.qkv_megatron_to_vllm(cfg, L.qkv_vllm_to_megatron(cfg, qkv)), qkv)


def test_fused_vllm_order():
    hf = random_weights(TINY, seed=1)
    f = L.hf_to_fused(TINY, hf)
    qkv = f["model.layers.1.self_attn.qkv_proj.weight"]
    assert_bitwise_equal(qkv[TINY.q_size:TINY.q_size + TINY.kv_size], hf["model.layers.1.self_attn.k_proj.weight"])
    gu = f["model.layers.0.mlp.gate_up_proj.weight"]
    assert_bitwise_equal(gu[TINY.intermediate_size:], hf["model.layers.0.mlp.up_proj.weight"])
