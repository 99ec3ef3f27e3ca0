"""kernel_baselines_bench on a machine without CUDA: a clear refusal, not a traceback (the timed
comparison itself runs on the H200 only: ci/h200_vllm.sh stage ``baselines``)."""

import pytest
import torch

from rlk.integrations.vllm import kernel_baselines_bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_refuses_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        kernel_baselines_bench.main(["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
