"""The stream-K prefill walk (``kernel_streamk``) gives the bytes of the one-program-per-tile walk.

Under the interpreter (programs run one after another, so every wait finds its flag set) the cases
put program boundaries inside tiles, inside segments and exactly at segment ends, with one and two
segments (v1) and v2's zero-padded last segment; each checks that the stream-K kernel really ran
(not the fallback), that every output byte equals the tiled kernel's and that the handoff flags are
zero again afterwards. GPU: ``test_gpu_streamk_bytes`` at Qwen3-8B shapes (``gpu`` marker).
"""

from __future__ import annotations

import pytest
import torch

from rlk.kernels.gemm import contract, gemm
from rlk.kernels.gemm import launch as gemm_launch
from rlk.kernels.gemm import kernel_streamk
from rlk.testing.shapes import QWEN3_8B_GEMMS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 8, "FLAT": 1, "PERSISTENT": 0,
        "num_warps": 4, "num_stages": 2}


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(DEV)


def _run(monkeypatch, x, w, nprog, contract_id, **cfg):
    """y of the stream-K schedule with ``nprog`` programs, and the kernels it launched."""
    launched = []
    real = gemm_launch.launch

    def spy(fn, grid, *a, **k):
        launched.append(fn)
        return real(fn, grid, *a, **k)

    monkeypatch.setattr(gemm_launch, "launch", spy)
    monkeypatch.setattr(gemm_launch, "num_progs", lambda device: nprog)
    monkeypatch.setattr(gemm_launch, "_SK_FLAGS", {})
    y = gemm(x, w, schedule="prefill", config=dict(TILE, STREAMK=1, **cfg), contract=contract_id)
    monkeypatch.undo()
    return y, launched


# (M, K, N, programs, contract): tiles of 16 x 16, k-steps of 64.
CASES = [
    # one segment (split 1); 5 tiles x 4 steps over 3 programs: cuts at steps 6 and 13 (inside tiles)
    (80, 256, 16, 3, contract.CONTRACT_ID),
    # two segments of 4 steps (split 2); 6 tiles over 4 programs: cuts at step 4 of tiles 1 and 4
    # (exactly at the segment end) and at a tile boundary
    (40, 512, 32, 4, contract.CONTRACT_ID),
    # two segments; 7 tiles over 3 programs: cuts at steps 2 (first segment) and 5 (second); odd M
    (97, 512, 16, 3, contract.CONTRACT_ID),
    # v2: 17 chunks -> 2 segments of 16, the last one padded past K; cuts inside the padding
    (33, 1088, 32, 4, contract.CONTRACT_ID_V2),
]


@pytest.mark.parametrize("M,K,N,nprog,cid", CASES)
@pytest.mark.parametrize("tma", [0, 1])
def test_streamk_equals_tile_walk(monkeypatch, M, K, N, nprog, cid, tma):
    split, _ = contract.segments(K, N, cid)
    assert split == (1 if K == 256 else 2)  # the cases cover both fold shapes
    x, w = _rand(M, K, seed=1), _rand(N, K, seed=2)
    y, launched = _run(monkeypatch, x, w, nprog, cid, TMA=tma)
    assert launched == [kernel_streamk.gemm_streamk_kernel]
    ref = gemm(x, w, schedule="prefill", config=dict(TILE, TMA=tma), contract=cid)
    assert torch.equal(y.view(torch.int16), ref.view(torch.int16))
    y32, _ = _run(monkeypatch, x, w, nprog, cid, TMA=tma)
    assert torch.equal(y32, y)  # run to run


def test_streamk_leaves_flags_zero_and_falls_back_below_one_tile_per_program(monkeypatch):
    x, w = _rand(80, 256, seed=3), _rand(16, 256, seed=4)
    flags = {}
    monkeypatch.setattr(gemm_launch, "num_progs", lambda device: 3)
    monkeypatch.setattr(gemm_launch, "_SK_FLAGS", flags)
    gemm(x, w, schedule="prefill", config=dict(TILE, STREAMK=1))
    (f,) = flags.values()
    assert f.numel() == 3 and int(f.abs().sum()) == 0
    # 2 tiles < 3 programs: the tiled walk runs instead (a share must hold a whole tile)
    launched = []
    real = gemm_launch.launch
    monkeypatch.setattr(gemm_launch, "launch", lambda fn, grid, *a, **k: launched.append(fn) or real(fn, grid, *a, **k))
    y = gemm(x[:32], w, schedule="prefill", config=dict(TILE, STREAMK=1))
    assert kernel_streamk.gemm_streamk_kernel not in launched
    assert torch.equal(y, gemm(x[:32], w, schedule="prefill", config=TILE))


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="needs a GPU")
@pytest.mark.parametrize("name", ["qkv", "o", "gate_up", "down", "tp4_qkv"])
@pytest.mark.parametrize("M", [96, 129, 256, 511])
def test_gpu_streamk_bytes(monkeypatch, name, M):
    K, N = QWEN3_8B_GEMMS[name]
    x, w = _rand(M, K, seed=5), _rand(N, K, seed=6)
    for bm, bn, bk, nw, ns in ((64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3)):
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "FLAT": 1, "PERSISTENT": 0, "TMA": 1,
               "num_warps": nw, "num_stages": ns}
        if -(-M // bm) * -(-N // bn) < torch.cuda.get_device_properties(0).multi_processor_count:
            continue
        ref = gemm(x, w, schedule="prefill", config=cfg)
        launched = []
        real = gemm_launch.launch
        monkeypatch.setattr(gemm_launch, "launch",
                            lambda fn, grid, *a, **k: launched.append(fn) or real(fn, grid, *a, **k))
        for _ in range(3):
            y = gemm(x, w, schedule="prefill", config=dict(cfg, STREAMK=1))
            assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), (name, M, cfg)
        monkeypatch.undo()
        assert kernel_streamk.gemm_streamk_kernel in launched
