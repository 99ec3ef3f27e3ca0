"""Comparison finds every differing element and names the first one; fixtures round-trip."""

import torch

from rlk.replay import fixture
from rlk.replay.compare import compare_logp, localize


def test_compare_counts_and_first():
    a = [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-0.5])]
    b = [t.clone() for t in a]
    c = compare_logp(a, b)
    assert c == {"sequences": 2, "compared_elements": 4, "mismatch_count": 0, "max_abs_diff": 0.0, "torch_equal": True}
    b[0][2] = torch.nextafter(b[0][2], torch.tensor(0.0))
    b[1][0] = -0.25
    c = compare_logp(a, b, prompt_lens=[5, 7])
    assert c["mismatch_count"] == 2 and not c["torch_equal"] and c["max_abs_diff"] == 0.25
    assert c["first_mismatch"]["sequence"] == 0 and c["first_mismatch"]["response_index"] == 2
    assert c["first_mismatch"]["position"] == 6


def test_signed_zero_counts_as_mismatch():
    c = compare_logp([torch.tensor([0.0])], [torch.tensor([-0.0])])
    assert c["mismatch_count"] == 1 and c["max_abs_diff"] == 0.0


def test_fixture_round_trip(tmp_path):
    fx = fixture.Fixture(prompts=[[1, 2, 3], [4]], responses=[[5, 6], [7, 8, 9]], arrival_steps=[0, 2],
                         page_tables=[[3], [0, 2]], rollout_logp=[torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -4.0, -5.0])],
                         meta={"route": "strict", "x": 1})
    fixture.save(fx, str(tmp_path))
    got = fixture.load(str(tmp_path))
    assert (got.prompts, got.responses, got.arrival_steps, got.page_tables) == \
        (fx.prompts, fx.responses, fx.arrival_steps, fx.page_tables)
    assert all(torch.equal(a, b) for a, b in zip(got.rollout_logp, fx.rollout_logp))
    assert got.meta["x"] == 1 and got.meta["sequences"] == 2


def test_localize_names_first_layer():
    from rlk.replay.trainer import pack

    pk = pack([[1, 2]], [[3]])
    t = {"attn_out": [torch.zeros(3, 4), torch.zeros(3, 4)], "mlp_out": [torch.zeros(3, 4), torch.ones(3, 4)],
         "final": torch.zeros(3, 4)}
    r = [{"attn_out.0": torch.zeros(2, 4), "mlp_out.0": torch.zeros(2, 4), "attn_out.1": torch.zeros(2, 4),
          "mlp_out.1": torch.zeros(2, 4), "final": torch.zeros(2, 4)}]
    got = localize([(pk, t)], r, [2], [1])
    assert got["probe"] == "mlp_out.1" and got["sequence"] == 0 and got["position"] == 0
