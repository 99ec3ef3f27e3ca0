"""GRPO arithmetic on inputs small enough to check by hand."""

import math

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.rl import grpo
from rlk.rl.task import TargetByteTask


def test_group_advantages_by_hand():
    # Groups (0, 1) and (1, 0): mean 0.5, sample std sqrt(0.5) = 0.70711; A = +-0.5 / 0.70711.
    a = grpo.group_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0]), 2, eps=0.0)
    h = 0.5 / math.sqrt(0.5)
    assert torch.allclose(a, torch.tensor([-h, h, h, -h]), rtol=0, atol=1e-6)
    # (0, 0.5, 1): mean 0.5, sample std 0.5 -> (-1, 0, 1); a group of equal rewards -> 0 (eps keeps it finite).
    a = grpo.group_advantages(torch.tensor([0.0, 0.5, 1.0, 0.25, 0.25, 0.25]), 3, eps=1e-6)
    assert torch.allclose(a, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), rtol=0, atol=1e-5)
    assert a[3:].eq(0).all()


def test_group_advantages_refuse_bad_input():
    with pytest.raises(UnsupportedConfigError, match="groups of 4"):
        grpo.group_advantages(torch.zeros(6), 4)
    with pytest.raises(UnsupportedConfigError, match="group_size"):
        grpo.group_advantages(torch.zeros(4), 1)
    with pytest.raises(UnsupportedConfigError, match="NaN"):
        grpo.group_advantages(torch.tensor([0.0, float("nan")]), 2)


# loss and dloss = d(loss)/d(logp) before the 1/n: -min(r A, clip(r) A) and -r A where unclipped.
@pytest.mark.parametrize("ratio,adv,loss,dloss", [
    (1.0, 1.0, -1.0, -1.0),  # on-policy: the plain policy gradient, -A
    (1.0, -2.0, 2.0, 2.0),
    (1.5, 1.0, -1.2, 0.0),  # above 1 + eps with A > 0: clipped, no gradient
    (1.5, -1.0, 1.5, 1.5),  # above 1 + eps with A < 0: the unclipped term is the minimum
    (0.5, 1.0, -0.5, -0.5),  # below 1 - eps with A > 0: unclipped
    (0.5, -1.0, 0.8, 0.0),  # below 1 - eps with A < 0: clipped, no gradient
])
def test_clipped_token_loss_by_hand(ratio, adv, loss, dloss):
    n = 4  # the normalizer divides loss and gradient
    old = torch.tensor([-1.0])
    lp = (old + math.log(ratio)).requires_grad_(True)
    out = grpo.clipped_token_loss(lp, old, torch.tensor([adv]), torch.tensor([True]), 0.2, n)
    out.sum().backward()
    assert out.item() == pytest.approx(loss / n, abs=1e-6)
    assert lp.grad.item() == pytest.approx(dloss / n, abs=1e-6)


def test_clipped_token_loss_masks_rows_and_stays_finite():
    lp = torch.tensor([-0.5, float("-inf"), -2.0], requires_grad=True)
    old = torch.tensor([-0.5, 0.0, -2.0])
    out = grpo.clipped_token_loss(lp, old, torch.tensor([1.0, 5.0, -1.0]), torch.tensor([True, False, True]), 0.2, 2)
    out.sum().backward()
    assert out.tolist() == [-0.5, 0.0, 0.5]
    assert torch.isfinite(lp.grad).all() and lp.grad[1] == 0
    with pytest.raises(UnsupportedConfigError):
        grpo.clipped_token_loss(lp, old, old, old > 0, 0.2, 0)


def test_token_loss_fn_chunks_equal_the_whole():
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(10, generator=g), -torch.rand(10, generator=g)
    adv, mask = torch.randn(10, generator=g), torch.rand(10, generator=g) > 0.3
    fn = grpo.token_loss_fn(old, adv, mask, 0.2, 7)
    whole = fn(lp, 0, 10)
    assert torch.equal(torch.cat([fn(lp[0:4], 0, 4), fn(lp[4:10], 4, 10)]), whole)
    assert torch.equal(whole, grpo.clipped_token_loss(lp, old, adv, mask, 0.2, 7))


def test_ratio_stats_counts_and_is_stricter_on_logp_bits():
    a = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.001])]
    same = grpo.ratio_stats(a, [t.clone() for t in a], clip_eps=0.2)
    assert (same["tokens"], same["ratio_not_one"], same["logp_mismatch"]) == (3, 0, 0)
    assert same["abs_dev"]["max"] == 0.0 and same["ratio_min"] == same["ratio_max"] == 1.0
    # One ulp at logp -0.001 (about 1e-10) still gives ratio exactly 1.0 in fp32; its bits differ.
    tiny = [a[0], torch.nextafter(a[1], torch.tensor(0.0))]
    s = grpo.ratio_stats(tiny, a)
    assert (s["ratio_not_one"], s["logp_mismatch"]) == (0, 1)
    # One ulp up at logp -2 (1.2e-7) moves the ratio to the float after 1.0; at -1 (6e-8, half
    # an ulp of 1.0) exp rounds back to 1.0 (ties to even): 1 ratio off, 2 logp differ.
    moved = [torch.nextafter(a[0], torch.tensor(0.0)), a[1]]
    s = grpo.ratio_stats(moved, a, clip_eps=0.2)
    assert (s["ratio_not_one"], s["logp_mismatch"]) == (1, 2) and 0 < s["abs_dev"]["max"] < 1e-6
    assert s["clip_fraction"] == 0.0
    far = grpo.ratio_stats([torch.tensor([-1.0, -1.0])], [torch.tensor([-1.5, -1.0])], clip_eps=0.2)
    assert far["ratio_max"] == pytest.approx(math.exp(0.5)) and far["clip_fraction"] == 0.5
    with pytest.raises(UnsupportedConfigError, match="sequence 0"):
        grpo.ratio_stats([torch.zeros(2)], [torch.zeros(3)])


def test_task_reward_and_prompts():
    t = TargetByteTask(target=ord("e"))
    assert t.reward(list(b"eeae")) == 0.75 and t.reward(list(b"xyz")) == 0.0
    assert t.rewards([list(b"e"), list(b"ab")]).tolist() == [1.0, 0.0]
    assert t.step_prompts(0, 2) == [list(b"def "), list(b"import ")]
    assert t.step_prompts(4, 2) == t.step_prompts(0, 2)  # 8 prompts cycle
    with pytest.raises(UnsupportedConfigError):
        t.reward([])
    with pytest.raises(UnsupportedConfigError, match="target token 300"):
        TargetByteTask(target=300).check(256)
