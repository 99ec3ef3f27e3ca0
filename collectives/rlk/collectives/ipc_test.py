"""The one-shot path's fold kernel (Triton interpreter on CPU): bitwise the ar.v1 chain.

The symmetric-memory transport itself needs >= 2 GPUs (collectives_multigpu_test.py).
"""

import pytest
import torch

from rlk.collectives import reference
from rlk.collectives.api import fold_rank_order
from rlk.collectives.ipc import fold_pointers
from rlk.collectives.scenarios import order_sensitive_input
from rlk.errors import UnsupportedConfigError
from rlk.testing import assert_bitwise_equal


def _ptrs(bufs):
    return torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                             (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_fold_pointers_equals_rank_order_chain(world, dtype, out_dtype):
    numel = 2500  # not a multiple of the block: a masked tail
    inputs = [order_sensitive_input(0, r, numel, dtype) for r in range(world)]
    out = torch.empty(numel, dtype=out_dtype)
    fold_pointers(_ptrs(inputs), numel, dtype, out)
    assert_bitwise_equal(out, fold_rank_order(torch.stack(inputs), out_dtype), f"world {world}")
    if out_dtype == dtype:
        assert_bitwise_equal(out, reference.fixed_order_sum(inputs), "reference")


def test_fold_pointers_order_matters_and_offsets():
    """The inputs are order-sensitive (a different rank order gives other bytes), and the
    element offset selects a slot inside each buffer."""
    numel, off = 1000, 1024
    inputs = [order_sensitive_input(0, r, numel, torch.float32) for r in range(4)]
    slots = [torch.cat([torch.full((off,), float("nan")), x]) for x in inputs]
    out = torch.empty(numel)
    fold_pointers(_ptrs(slots), numel, torch.float32, out, elem_offset=off)
    assert_bitwise_equal(out, fold_rank_order(torch.stack(inputs), torch.float32), "slot at offset")
    rev = torch.empty(numel)
    fold_pointers(_ptrs(slots[::-1]), numel, torch.float32, rev, elem_offset=off)
    assert not torch.equal(rev, out), "rank order did not change the bytes: the test could not fail"


def test_fold_pointers_bad_input():
    x = torch.zeros(4)
    with pytest.raises(UnsupportedConfigError, match="dtypes"):
        fold_pointers(_ptrs([x]), 4, torch.float16, torch.empty(4))
    with pytest.raises(UnsupportedConfigError, match="int64"):
        fold_pointers(_ptrs([x]).to(torch.int32), 4, torch.float32, torch.empty(4))
    with pytest.raises(UnsupportedConfigError, match="contiguous"):
        fold_pointers(_ptrs([x]), 4, torch.float32, torch.empty(5))
