import pytest

from rlk.bench.attribution import categorize


@pytest.mark.parametrize("name, cat", [
    ("_gemm_kernel_prefill", "gemm"), ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"), ("nvjet_tst_128x64", "gemm"),
    ("_attn_fwd_varlen", "attention"), ("pytorch_flash::flash_fwd_kernel", "attention"),
    ("_linear_logp_fwd", "logp"), ("cunn_SoftMaxForward", "logp"), ("_rmsnorm_fwd", "norm"),
    ("_rope_kernel", "rope"), ("_swiglu_fwd", "swiglu"), ("Memcpy DtoD", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4>", "elementwise"), ("mystery_kernel", "other"),
    # rlk's own Triton kernel names (kernels/rlk/kernels/*/kernel*.py)
    ("fwd_stats_kernel", "logp"), ("merge_kernel", "logp"), ("bwd_grad_kernel", "logp"),
    ("attn_fwd_kernel", "attention"), ("attn_merge_kernel", "attention"), ("bwd_dkdv_kernel", "attention"),
    ("bwd_dq_kernel", "attention"), ("bwd_delta_kernel", "attention"), ("write_kv_kernel", "copy"),
    ("rmsnorm_fwd_kernel", "norm"), ("fold_partials_kernel", "norm"), ("gemm_segment_kernel", "gemm"),
    ("gemm_tiled_kernel", "gemm"), ("gemm_kernel", "gemm"), ("embedding_fwd_kernel", "embedding"),
    ("grad_from_logits_kernel", "logp"), ("scale_kernel", "logp"),
    # vLLM's kernels: FlashAttention 3 (CUTLASS device kernels), its sampler; "else" is no "lse".
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<>>>", "attention"),
    ("flash_fwd_splitkv_kernel", "attention"), ("gumbel_sample_kernel", "sampling"),
    ("act_and_mul_kernel", "swiglu"), ("something_else", "other"),
])
def test_kernel_names_map_to_categories(name, cat):
    assert categorize(name) == cat
