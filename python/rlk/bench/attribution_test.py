import pytest

from rlk.bench.attribution import categorize


@pytest.mark.parametrize("name, cat", [
    ("_gemm_kernel_prefill", "gemm"), ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"), ("nvjet_tst_128x64", "gemm"),
    ("_attn_fwd_varlen", "attention"), ("pytorch_flash::flash_fwd_kernel", "attention"),
    ("_linear_logp_fwd", "logp"), ("cunn_SoftMaxForward", "logp"), ("_rmsnorm_fwd", "norm"),
    ("_rope_kernel", "rope"), ("_swiglu_fwd", "swiglu"), ("Memcpy DtoD", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4>", "elementwise"), ("mystery_kernel", "other"),
])
def test_kernel_names_map_to_categories(name, cat):
    assert categorize(name) == cat
