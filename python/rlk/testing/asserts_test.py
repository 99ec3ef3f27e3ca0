import pytest
import torch

from rlk.errors import ExactnessError
from rlk.testing import assert_batch_invariant, assert_bitwise_equal, cases, first_difference


def test_equal_bytes_pass_and_negative_zero_is_caught():
    a = torch.tensor([0.0, 1.5], dtype=torch.bfloat16)
    assert_bitwise_equal(a, a.clone())
    b = torch.tensor([-0.0, 1.5], dtype=torch.bfloat16)
    with pytest.raises(ExactnessError, match=r"first at \(0,\).*0x0000.*0x8000"):
        assert_bitwise_equal(a, b)


def test_message_names_index_values_and_count():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    b = a.clone()
    b[2, 1] = torch.nextafter(b[2, 1], torch.tensor(100.0))
    b[2, 3] += 1
    with pytest.raises(ExactnessError) as ei:
        assert_bitwise_equal(b, a, "probe")
    msg = str(ei.value)
    assert "probe: 2 of 12 elements differ; first at (2, 1)" in msg
    assert "0x41100001" in msg and "0x41100000" in msg
    assert first_difference(b, a) == (2, 1)


def test_dtype_and_shape_mismatch():
    with pytest.raises(ExactnessError, match="dtype"):
        assert_bitwise_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ExactnessError, match="shape"):
        assert_bitwise_equal(torch.zeros(2), torch.zeros(3))


def test_nan_payloads_compare_by_bytes():
    n = torch.tensor([float("nan")])
    assert_bitwise_equal(n, n.clone())


def test_batch_invariance_helper_detects_row_coupling():
    x = torch.randn(9, 4)
    assert_batch_invariant(lambda t: t * 2, x, [1, 3, 9])
    with pytest.raises(ExactnessError, match=r"rows\[:3\]"):
        assert_batch_invariant(lambda t: t - t.mean(0), x, [3])


def test_shape_catalog_has_awkward_cpu_cases_per_op():
    for op in ("gemm", "rowops", "attention", "linear_logp"):
        assert cases(op, "cpu"), op
    assert cases("gemm", "awkward")
