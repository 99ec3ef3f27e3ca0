"""Accuracy (vs fp64), backward accuracy, bad-input errors of ``logp.v2``.

CPU runs use the Triton interpreter (fp32 dot operands, numpy exp/log): they check the
algorithm (segments, masking, merge, gradients), not GPU bf16 bits. GPU cases are marked ``gpu``.

Tolerances (one table): logp/lse/entropy vs fp64 from the same bf16 inputs: |err| <= 2e-5 *
(1 + |ref|) on CPU, 2e-4 * (1 + |ref|) on GPU (H=4096 dot products, approximate exp/log);
logits: 1e-5 * (1 + |ref|); gradients: max |err| <= 1.5e-2 * max |ref| (bf16 grad logits and
bf16 outputs, 8 mantissa bits).
"""

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.linear_logp import launch
from rlk.kernels.linear_logp import reference as R
from rlk.kernels.linear_logp.autograd import linear_logp

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CPU_SEG = (64, 32)
FWD_TOL = {"cpu": 2e-5, "cuda": 2e-4}
GRAD_TOL = 1.5e-2


def make(T, H, V, vocab_real, device="cpu", seed=0, wscale=0.5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g).to(device=device, dtype=torch.bfloat16)
    w = (torch.randn(V, H, generator=g) * wscale / H ** 0.5 * 8).to(device=device, dtype=torch.bfloat16)
    tg = torch.randint(0, vocab_real, (T,), generator=g).to(device)
    tg[0] = vocab_real - 1  # the last real column
    return h, w, tg


def _close(actual, ref, tol, what):
    err = (actual.double() - ref).abs()
    bound = tol * (1 + ref.abs())
    assert bool((err <= bound).all()), f"{what}: max err {err.max().item():.3e} (tol {tol} * (1 + |ref|))"


def _check_forward(h, w, tg, vocab_real, temperature, seg, tol):
    out = linear_logp(h, w, tg, 0, vocab_real, temperature, return_entropy=True, return_logits=True,
                      segmentation=seg)
    rlogp, rlse, rent = R.linear_logp_ref(h, w, tg, 0, vocab_real, temperature)
    _close(out.logp, rlogp, tol, "logp")
    _close(out.lse, rlse, tol, "lse")
    _close(out.entropy, rent, tol * 10, "entropy")
    rl = R.logits_ref(h, w, 0, vocab_real, temperature)
    pad = torch.isinf(rl)
    assert bool(torch.isneginf(out.logits[pad]).all()), "padded logits must be -inf"
    _close(out.logits[~pad], rl[~pad], tol, "logits")
    assert out.logp.dtype == out.lse.dtype == out.entropy.dtype == out.logits.dtype == torch.float32


@pytest.mark.parametrize("V,vocab_real,temperature,T", [(257, 250, 1.0, 17), (512, 500, 0.7, 7)])
def test_forward_matches_fp64(V, vocab_real, temperature, T):
    h, w, tg = make(T, 64, V, vocab_real)
    _check_forward(h, w, tg, vocab_real, temperature, CPU_SEG, FWD_TOL["cpu"])


def test_forward_short_last_segment():
    h, w, tg = make(5, 64, 300, 290, seed=3)
    _check_forward(h, w, tg, 290, 1.3, (128, 48), FWD_TOL["cpu"])


def test_target_logit_matches_logits_output():
    h, w, tg = make(7, 64, 257, 257)
    out = linear_logp(h, w, tg, return_logits=True, segmentation=CPU_SEG)
    x = out.logits.gather(1, tg[:, None]).squeeze(1)
    torch.testing.assert_close(out.logp, x - out.lse, rtol=0, atol=0)


def _check_backward(h, w, tg, vocab_real, temperature, seg, seed=1):
    T = h.shape[0]
    g = torch.Generator().manual_seed(seed)
    dlogp, dlse, dent = (torch.randn(T, generator=g).to(h.device) for _ in range(3))
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = linear_logp(hh, ww, tg, 0, vocab_real, temperature, return_entropy=True, segmentation=seg)
    ((out.logp * dlogp).sum() + (out.lse * dlse).sum() + (out.entropy * dent).sum()).backward()
    rdh, rdw = R.linear_logp_grads_ref(h, w, tg, dlogp, dlse, dent, vocab_real, temperature)
    for name, a, r in (("d_hidden", hh.grad, rdh), ("d_weight", ww.grad, rdw)):
        assert a.dtype == torch.bfloat16 and a.shape == r.shape
        err = (a.double() - r).abs().max().item()
        assert err <= GRAD_TOL * r.abs().max().item(), f"{name}: max err {err:.3e} vs max |ref| {r.abs().max():.3e}"
    # Padded columns get exactly zero weight gradient.
    assert bool((ww.grad[vocab_real:] == 0).all())


def test_backward_matches_fp64():
    h, w, tg = make(7, 64, 257, 250)
    _check_backward(h, w, tg, 250, 0.7, CPU_SEG)


def test_backward_logp_only_and_forward_only_path():
    h, w, tg = make(3, 64, 130, 130, seed=2)
    hh = h.clone().requires_grad_(True)
    out = linear_logp(hh, w, tg, segmentation=CPU_SEG)  # weight frozen: only d_hidden
    out.logp.sum().backward()
    rdh, _ = R.linear_logp_grads_ref(h, w, tg, torch.ones(3))
    assert (hh.grad.double() - rdh).abs().max() <= GRAD_TOL * rdh.abs().max()
    with torch.no_grad():
        ref = linear_logp(hh, w, tg, segmentation=CPU_SEG)
    assert ref.logp.grad_fn is None
    torch.testing.assert_close(ref.logp, out.logp.detach(), rtol=0, atol=0)


def _bad(fn, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        fn()


def test_bad_inputs_raise_before_launch():
    h, w, tg = make(4, 64, 128, 120)
    kw = dict(segmentation=CPU_SEG)
    _bad(lambda: linear_logp(h, w, torch.tensor([0, 1, 2, 120]), 0, 120, **kw), "outside")
    _bad(lambda: linear_logp(h, w, torch.tensor([0, -1, 2, 3]), 0, 120, **kw), "outside")
    _bad(lambda: linear_logp(h[:0], w, tg[:0], 0, 120, **kw), "empty")
    _bad(lambda: linear_logp(h.float(), w, tg, 0, 120, **kw), "dtype")
    _bad(lambda: linear_logp(h, w.half(), tg, 0, 120, **kw), "dtype")
    _bad(lambda: linear_logp(h, w, tg.int(), 0, 120, **kw), "dtype")
    _bad(lambda: linear_logp(h, w, tg[:3], 0, 120, **kw), "entries")
    _bad(lambda: linear_logp(h[:, :32], w[:, :32], tg, 0, 120, **kw), "multiple of 64")
    _bad(lambda: linear_logp(h, w[:, :64].contiguous()[:, :0], tg, 0, 120, **kw), "disagree|empty")
    _bad(lambda: linear_logp(h, w, tg, 0, 120, 0.0, **kw), "temperature")
    _bad(lambda: linear_logp(h, w, tg, 0, 120, float("nan"), **kw), "temperature")
    _bad(lambda: linear_logp(h, w, tg, 0, 120, segmentation=(64, 16)), "segmentation")
    # Shard boundaries off the alignment blocks.
    _bad(lambda: launch.segment_stats(h, w[:96], tg, 32, 250, segmentation=CPU_SEG), "alignment")
    _bad(lambda: launch.segment_stats(h, w[:96], tg, 0, 250, segmentation=CPU_SEG), "last shard")
    _bad(lambda: launch.merge_segment_stats([]), "non-empty")


# ----------------------------------------------------------------------------------------------
# GPU (H200): Qwen3-8B sizes. Not run on CPU.

@pytest.mark.gpu
@pytest.mark.parametrize("V,vocab_real", [(37984, 37984), (151936, 151669)])
def test_gpu_forward_matches_fp64(V, vocab_real):
    h, w, tg = make(257, 4096, V, vocab_real, device="cuda")
    _check_forward(h, w, tg, vocab_real, 1.0, None, FWD_TOL["cuda"])
    _check_forward(h[:33], w, tg[:33], vocab_real, 0.6, None, FWD_TOL["cuda"])


@pytest.mark.gpu
def test_gpu_backward_matches_fp64():
    h, w, tg = make(96, 4096, 37984, 37984, device="cuda")
    _check_backward(h, w, tg, 37984, 0.8, None)
